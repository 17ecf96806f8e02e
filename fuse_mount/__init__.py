"""fuse_mount."""
