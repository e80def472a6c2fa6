//! Durable per-source cursors: one small file per source, replaced atomically.

use std::io::Write;
use std::path::PathBuf;

use crate::error::IngestError;

/// Stores each source's cursor in `{dir}/{name}.cursor`.
#[derive(Debug, Clone)]
pub struct CursorStore {
    dir: PathBuf,
}

impl CursorStore {
    /// A store in `dir` (created on first save).
    pub fn new(dir: PathBuf) -> CursorStore {
        CursorStore { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.cursor"))
    }

    /// The saved cursor, or `None` for a source never saved.
    pub fn load(&self, name: &str) -> Result<Option<String>, IngestError> {
        let path = self.path(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim_end_matches('\n').to_owned())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(IngestError::Cursor {
                path: path.display().to_string(),
                message: error.to_string(),
            }),
        }
    }

    /// Saves a cursor durably: write a temporary file, fsync, rename over the old one.
    pub fn save(&self, name: &str, cursor: &str) -> Result<(), IngestError> {
        let path = self.path(name);
        let failure = |error: std::io::Error| IngestError::Cursor {
            path: path.display().to_string(),
            message: error.to_string(),
        };
        std::fs::create_dir_all(&self.dir).map_err(failure)?;
        let temporary = self.dir.join(format!(".{name}.cursor.tmp"));
        let mut file = std::fs::File::create(&temporary).map_err(failure)?;
        file.write_all(cursor.as_bytes()).map_err(failure)?;
        file.sync_all().map_err(failure)?;
        std::fs::rename(&temporary, &path).map_err(failure)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_loads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = CursorStore::new(dir.path().join("nested"));
        assert_eq!(store.load("a").expect("load"), None);
        store.save("a", "page-7").expect("save");
        store.save("a", "page-8").expect("save");
        assert_eq!(store.load("a").expect("load").as_deref(), Some("page-8"));
        assert_eq!(store.load("b").expect("load"), None);
    }
}
