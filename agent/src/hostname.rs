//! This machine's host name, without libc: `/proc/sys/kernel/hostname`, then `$HOSTNAME`, then
//! `/etc/hostname`, then `localhost`.

use std::path::Path;

/// The host name of this machine (never empty).
pub fn hostname() -> String {
    from_sources(
        std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
        std::env::var("HOSTNAME").ok(),
        read(Path::new("/etc/hostname")),
    )
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The first non-empty candidate, trimmed; `localhost` when there is none.
fn from_sources(proc: Option<String>, env: Option<String>, etc: Option<String>) -> String {
    [proc, env, etc]
        .into_iter()
        .flatten()
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_non_empty_trimmed() {
        assert_eq!(from_sources(Some("node1\n".into()), None, None), "node1");
        assert_eq!(
            from_sources(Some(" \n".into()), Some("n2".into()), None),
            "n2"
        );
        assert_eq!(from_sources(None, None, Some("n3\n".into())), "n3");
        assert_eq!(from_sources(None, None, None), "localhost");
    }

    #[test]
    fn this_machine_has_one() {
        let h = hostname();
        assert!(!h.is_empty());
        assert_eq!(h, h.trim());
    }
}
