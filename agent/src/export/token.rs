//! The bearer token of `--auth-token-file`, sent as `Authorization: Bearer <token>` over
//! OTLP/HTTP and as the `authorization` metadata over OTLP/gRPC.
//!
//! The file holds one token; whitespace around it (a trailing newline) is ignored. At start an
//! unreadable or empty file, or one whose token has characters an HTTP header cannot carry
//! (anything but visible ASCII: spaces, control characters, non-ASCII), stops the agent with
//! [`Error::AuthToken`]. Then, before each send, the file's status is looked at (one `stat`):
//! when its modification time, size or inode changed it is read again, so a rotated token — a
//! Kubernetes Secret update swaps the file behind a symlink, `systemctl reload` is not needed —
//! is used from the next send on. A refused send (401/403) reads it again unconditionally. A
//! file that cannot be read or checked later keeps the last good token in use (logged once per
//! problem). The token itself is never logged nor shown by `Debug`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use reqwest::header::HeaderValue;
use tonic::metadata::{Ascii, MetadataValue};
use tracing::{info, warn};

use crate::error::{Error, Result};

/// The `Authorization` value in the forms both transports need, made once per token.
#[derive(Clone)]
pub(crate) struct Bearer {
    pub(crate) http: HeaderValue,
    pub(crate) grpc: MetadataValue<Ascii>,
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

/// What tells that the file changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let meta = std::fs::metadata(path)?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Ok(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode,
    })
}

/// Check a token file's text; the error never quotes the token.
pub fn parse_token(text: &str) -> Result<String, String> {
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".to_string());
    }
    if token.chars().any(char::is_whitespace) {
        return Err("it holds more than one word or line; it must hold one token only".to_string());
    }
    if let Some(at) = token.chars().position(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "character {} of the token is not visible ASCII, which an HTTP header cannot carry",
            at + 1
        ));
    }
    Ok(token.to_string())
}

fn bearer(token: &str) -> Result<Bearer, String> {
    let value = format!("Bearer {token}");
    let mut http = HeaderValue::from_str(&value)
        .map_err(|_| "the token cannot be sent in an HTTP header".to_string())?;
    http.set_sensitive(true);
    let mut grpc = MetadataValue::<Ascii>::try_from(value.as_str())
        .map_err(|_| "the token cannot be sent as gRPC metadata".to_string())?;
    grpc.set_sensitive(true);
    Ok(Bearer { http, grpc })
}

fn read(path: &Path) -> Result<(Bearer, Stamp), String> {
    let before = stamp(path).map_err(|e| format!("cannot read it: {e}"))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let token = parse_token(&text)?;
    Ok((bearer(&token)?, before))
}

/// The token file, read again when it changes.
pub struct TokenFile {
    path: PathBuf,
    bearer: Bearer,
    stamp: Stamp,
    /// Why the last look failed, so that one problem is logged once, not at every send.
    problem: Option<String>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// Read and check the file: the start-up check.
    pub fn load(path: &Path) -> Result<Self> {
        let (bearer, stamp) = read(path).map_err(|reason| Error::AuthToken {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            bearer,
            stamp,
            problem: None,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The value to send.
    pub(crate) fn bearer(&self) -> &Bearer {
        &self.bearer
    }

    /// Read the file again if it changed since the last read, or in any case with `force`.
    /// `true` when a different file (or different text) was read and its token is now in use.
    pub fn refresh(&mut self, force: bool) -> bool {
        let now = match stamp(&self.path) {
            Ok(s) => s,
            Err(e) => {
                self.problem(format!("cannot read it: {e}"));
                return false;
            }
        };
        if !force && now == self.stamp && self.problem.is_none() {
            return false;
        }
        match read(&self.path) {
            Ok((bearer, stamp)) => {
                let was_failing = self.problem.take().is_some();
                self.stamp = stamp;
                if bearer.http == self.bearer.http {
                    if was_failing {
                        info!(path = %self.path.display(), "bearer token file readable again; same token");
                    }
                    return false;
                }
                self.bearer = bearer;
                info!(path = %self.path.display(), "bearer token file changed: the new token is used from now on");
                true
            }
            Err(reason) => {
                self.problem(reason);
                false
            }
        }
    }

    fn problem(&mut self, reason: String) {
        if self.problem.as_deref() != Some(reason.as_str()) {
            warn!(
                path = %self.path.display(),
                reason = %reason,
                "bearer token file cannot be used; sending with the last good token until it is fixed"
            );
            self.problem = Some(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_holds_one_visible_ascii_token() {
        assert_eq!(
            parse_token("abc-DEF_123.~+/=\n").unwrap(),
            "abc-DEF_123.~+/="
        );
        assert_eq!(parse_token("  \t tok\r\n\n").unwrap(), "tok");
        for (text, says) in [
            ("", "empty"),
            (" \n\n", "empty"),
            ("one two", "one token"),
            ("one\ntwo\n", "one token"),
            ("tok\u{7f}en", "visible ASCII"),
            ("tok\u{0}en", "visible ASCII"),
            ("jeton-été", "character 7"),
        ] {
            let e = parse_token(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        // The message never carries the token.
        let e = parse_token("secret-part\u{1}").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn bad_files_are_start_up_errors_without_the_token() {
        let dir = tempfile_dir("bad");
        let path = dir.join("token");
        let e = TokenFile::load(&path).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("cannot read it"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        let e = TokenFile::load(&path).unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
        std::fs::write(&path, "hunter2-hunter2 extra\n").unwrap();
        let e = TokenFile::load(&path).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // A directory is not a token file.
        let e = TokenFile::load(&dir).unwrap_err();
        assert!(e.to_string().contains("cannot read it"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_token() {
        let dir = tempfile_dir("rotate");
        let path = dir.join("token");
        std::fs::write(&path, "first-token-0123456789\n").unwrap();
        let mut t = TokenFile::load(&path).unwrap();
        assert_eq!(t.bearer().http, "Bearer first-token-0123456789");
        assert!(t.bearer().http.is_sensitive());
        assert!(!format!("{t:?} {:?}", t.bearer()).contains("first-token"));
        assert!(!t.refresh(false), "unchanged file");
        // Replaced the way a Kubernetes Secret volume does it: a new file moved over the old
        // one (a new inode, whatever the clock's resolution).
        let next = dir.join("token.new");
        std::fs::write(&next, "second-token-0123456789").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert!(t.refresh(false));
        assert_eq!(t.bearer().http, "Bearer second-token-0123456789");
        assert_eq!(
            t.bearer().grpc.to_str().unwrap(),
            "Bearer second-token-0123456789"
        );
        // Emptied, then removed: the last good token stays in use.
        std::fs::write(&path, "").unwrap();
        assert!(!t.refresh(false));
        std::fs::remove_file(&path).unwrap();
        assert!(!t.refresh(true));
        assert_eq!(t.bearer().http, "Bearer second-token-0123456789");
        // Fixed: used again.
        std::fs::write(&path, "third-token-0123456789\n").unwrap();
        assert!(t.refresh(false));
        assert_eq!(t.bearer().http, "Bearer third-token-0123456789");
        // Forced re-read of the same text: nothing changes.
        assert!(!t.refresh(true));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuwatch-agent-token-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
