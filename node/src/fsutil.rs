//! Small file helpers shared by the key and identity stores.

use std::io::Write;
use std::path::Path;

/// Creates `path` (which must not exist yet) with `bytes`, readable and writable by the owner
/// only, and syncs it to disk: secrets must neither leak to other users nor be lost on a crash.
pub fn write_private_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
