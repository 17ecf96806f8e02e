#!/usr/bin/env bash
# apt-install.sh PACKAGE...: install Debian packages (as root) for scripts/bootstrap.sh.
# Waits up to $APT_LOCK_WAIT seconds (default 600) for another apt or dpkg (unattended-upgrades
# on a fresh machine) to let go of its locks instead of failing with apt's "Could not get
# lock", refreshes package lists older than a day, and shows progress while apt runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
wait_max=${APT_LOCK_WAIT:-600}
locks=(/var/lib/apt/lists/lock /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock)

# held_by: "PATH is held by process PID (COMMAND)" for the first of the locks a process holds,
# or nothing. apt takes them with fcntl; /proc/locks names each such lock's holder by its
# file's device and inode.
held_by() {
    python3 - "${locks[@]}" <<'EOF'
import os, sys
held = {}
with open("/proc/locks") as f:
    for line in f:
        fields = line.split()
        if "->" in fields:  # a process waiting for the lock, not holding it
            continue
        if len(fields) >= 6 and fields[1] == "POSIX":
            major, minor, inode = fields[5].split(":")
            held[(int(major, 16), int(minor, 16), int(inode))] = int(fields[4])
for path in sys.argv[1:]:
    try:
        st = os.stat(path)
    except OSError:
        continue
    pid = held.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    if pid is not None:
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            comm = "?"
        print(f"{path} is held by process {pid} ({comm})")
        break
EOF
}

wait_for_locks() {
    local waited=0 who
    while who=$(held_by) && [ -n "$who" ]; do
        if [ "$waited" -ge "$wait_max" ]; then
            echo "bootstrap: gave up after ${wait_max}s: $who; try again once it is done" >&2
            exit 1
        fi
        [ $((waited % 15)) = 0 ] && echo "bootstrap: waiting for apt: $who" >&2
        sleep 1
        waited=$((waited + 1))
    done
}

wait_for_locks
lock=(-o "DPkg::Lock::Timeout=$wait_max")
echo "bootstrap: from Debian: $* (a minute or two when new)" >&2
mkdir -p .venv
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null)" ]; then
    # apt-get update does not wait for the lists lock as install waits for dpkg's: wait first.
    run_logged "apt-get update" .venv/apt.log apt-get "${lock[@]}" update
    wait_for_locks
fi
run_logged "apt-get install" .venv/apt.log env DEBIAN_FRONTEND=noninteractive \
    apt-get "${lock[@]}" install -y --no-install-recommends "$@"
