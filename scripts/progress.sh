# Sourced by bootstrap.sh and apt-install.sh.
# run_logged LABEL LOG CMD...: run CMD with its output in LOG, showing LABEL, the seconds so far
# and LOG's last line while it runs (rewritten in place on a terminal, every 15 s otherwise).
# On failure, LOG's tail is printed and the calling script stops.
run_logged() {
    local label=$1 log=$2 pid t=0 last
    shift 2
    "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        t=$((t + 1))
        last=$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-40)
        if [ -t 2 ]; then
            printf '\r\033[K  %s: %ds  %s' "$label" "$t" "$last" >&2
        elif [ $((t % 15)) = 0 ]; then
            printf '  %s: %ds  %s\n' "$label" "$t" "$last" >&2
        fi
    done
    if [ -t 2 ]; then printf '\r\033[K' >&2; fi
    if ! wait "$pid"; then
        echo "bootstrap: $label failed; the end of $log:" >&2
        tail -n 20 "$log" >&2
        exit 1
    fi
    echo "  $label: done in ${t}s" >&2
}
