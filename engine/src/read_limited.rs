//! Reading a user-named file with a size limit that holds for anything the path names.
//!
//! A size check on `metadata` protects only regular files: `/dev/zero`, a FIFO, a pipe
//! or a `/proc` file report a length of 0 (or none) and then stream without end, and a
//! read-it-all-then-check grew to gigabytes before the check ran. Every file flow reads
//! on a user's behalf (workflow, `--inputs-file`, `--config`, `--secrets-file`) goes
//! through [`read`], which never reads more than `limit + 1` bytes (the one extra byte
//! tells "exactly at the limit" from "over it"), so memory and time stay bounded.

use std::io::Read;
use std::path::Path;

/// The limit of every file flow reads on a user's behalf: 1 MiB (a workflow, an inputs
/// file, `flow.toml`, a secrets file are all far smaller in practice).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file holds more than the limit: refused without reading the rest (invalid
    /// input, exit 2).
    #[error("{path}: larger than the limit of {limit} bytes (1 MiB); nothing past it was read")]
    TooLarge {
        /// The path as given.
        path: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// The path names a directory.
    #[error("{path}: is a directory")]
    IsDirectory {
        /// The path as given.
        path: String,
    },
    /// The file could not be opened or read (missing, permissions, I/O error).
    #[error("{path}: {source}")]
    Io {
        /// The path as given.
        path: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
}

impl Error {
    /// The error without the path (for callers whose message already names the file).
    pub fn reason(&self) -> String {
        match self {
            Error::TooLarge { limit, .. } => {
                format!("larger than the limit of {limit} bytes (1 MiB); nothing past it was read")
            }
            Error::IsDirectory { .. } => "is a directory".to_string(),
            Error::Io { source, .. } => source.to_string(),
        }
    }

    /// Whether the file was refused for its size (the caller's exit code 2).
    pub fn is_too_large(&self) -> bool {
        matches!(self, Error::TooLarge { .. })
    }
}

/// Reads at most `limit` bytes of `path` (a regular file, FIFO, character device,
/// `/proc` file…); more than that is [`Error::TooLarge`], found after reading
/// `limit + 1` bytes at most.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    let shown = || path.display().to_string();
    let io = |source: std::io::Error| Error::Io {
        path: shown(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(Error::IsDirectory { path: shown() });
    }
    if meta.is_file() && meta.len() > limit {
        // A regular file tells its size: no need to read a byte.
        return Err(Error::TooLarge {
            path: shown(),
            limit,
        });
    }
    read_from(file, limit).map_err(|e| match e {
        ReadFromError::TooLarge => Error::TooLarge {
            path: shown(),
            limit,
        },
        ReadFromError::Io(source) => Error::Io {
            path: shown(),
            source,
        },
    })
}

/// Reads `path` as UTF-8 text within `limit` (see [`read`]); bad UTF-8 is an
/// [`Error::Io`] of kind `InvalidData`.
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, Error> {
    let bytes = read(path, limit)?;
    String::from_utf8(bytes).map_err(|e| Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error()),
    })
}

enum ReadFromError {
    TooLarge,
    Io(std::io::Error),
}

fn read_from(reader: impl Read, limit: u64) -> Result<Vec<u8>, ReadFromError> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(ReadFromError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadFromError::TooLarge);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_limit_is_read_one_past_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"abcd").expect("write");
        assert_eq!(read(&p, 4).expect("at the limit"), b"abcd");
        assert!(read(&p, 3).expect_err("over").is_too_large());
        assert!(matches!(
            read(dir.path(), 10),
            Err(Error::IsDirectory { .. })
        ));
        assert!(matches!(
            read(&dir.path().join("missing"), 10),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn an_endless_stream_is_cut_at_the_limit() {
        let started = std::time::Instant::now();
        let err = read(Path::new("/dev/zero"), MAX_FILE_BYTES).expect_err("endless");
        assert!(err.is_too_large(), "{err}");
        assert!(err.to_string().contains("1048576 bytes"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // A stream that ends within the limit is read whole.
        assert_eq!(
            read_from(std::io::repeat(b'x').take(10), 10).ok(),
            Some(vec![b'x'; 10])
        );
    }
}
