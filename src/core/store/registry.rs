//! Which engines have a database file open: each holds a shared `flock` on a side
//! file (`<db>-engines`) for as long as it is open. An engine that finds itself the
//! only one may keep SQLite's write lock across calls (grouped writes); as soon as
//! another engine opens the file, it goes back to one commit per call. This only
//! decides how long the write lock is held: SQLite's lock alone makes admission
//! atomic.
use std::fs::{File, OpenOptions};
use std::path::PathBuf;

pub struct Registry {
    file: File,
    path: PathBuf,
}

impl Registry {
    /// Registers an engine on `db_path`. `None` when the side file cannot be used
    /// (the engine then never counts itself alone).
    pub fn join(db_path: &str) -> Option<Registry> {
        // One side file per database, whatever path (relative, through a symlink) an
        // engine opened it by; removed by that name even after a chdir.
        let mut name = std::fs::canonicalize(db_path).ok()?.into_os_string();
        name.push("-engines");
        let path = PathBuf::from(name);
        for _ in 0..8 {
            let file =
                OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).ok()?;
            file.lock_shared().ok()?;
            // The last engine to leave removes the file: ours may have been removed
            // between the open and the lock. Then register on the new one.
            if same_file(&file, &path) {
                return Some(Registry { file, path });
            }
        }
        None
    }

    /// True when no other engine has the file open now.
    pub fn alone(&self) -> bool {
        // Converting the shared lock drops it first; it is taken again either way.
        let alone = self.file.try_lock().is_ok();
        let _ = self.file.lock_shared();
        alone
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The last one out removes the side file (as SQLite removes -wal and -shm).
        if self.file.try_lock().is_ok() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &PathBuf) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &PathBuf) -> bool {
    path.exists()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn alone_until_a_second_engine_joins_and_the_last_removes_the_file() {
        let dir = std::env::temp_dir().join(format!("qe-registry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("q.db").to_string_lossy().into_owned();
        std::fs::write(&db, b"").unwrap(); // SQLite has created it by the time engines join
        let a = Registry::join(&db).unwrap();
        assert!(a.alone());
        assert!(a.alone(), "checking keeps the registration");
        let b = Registry::join(&db).unwrap();
        assert!(!a.alone());
        assert!(!b.alone());
        drop(a);
        assert!(b.alone());
        assert!(std::path::Path::new(&format!("{db}-engines")).exists());
        drop(b);
        assert!(!std::path::Path::new(&format!("{db}-engines")).exists());
        // The same file through a symlink is the same registration.
        #[cfg(unix)]
        {
            let link = dir.join("link.db");
            std::os::unix::fs::symlink(&db, &link).unwrap();
            let a = Registry::join(&db).unwrap();
            let b = Registry::join(link.to_str().unwrap()).unwrap();
            assert!(!a.alone() && !b.alone());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
