//! The open-file limit: the soft `RLIMIT_NOFILE` raised to the hard limit at start, as every Go
//! program does since Go 1.19 (package `os` raises it at init, so kube-controller-manager has
//! it), and logged. Every connection — to the API server, from a scraper or a probe — holds a
//! file descriptor; a container's soft limit is often 1024 while its hard limit is far higher.
//! Issue 31, item 4: with 1024 and idle connections to a plain port the controller could not
//! open a connection to list Nodes ("Too many open files"). The ports' own connection cap
//! ([`crate::http_server`]) keeps their share bounded whatever the limit.

/// The open-file limit before and after [`raise_to_hard_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit the process started with, descriptors.
    pub before: u64,
    /// The soft limit now, descriptors: the hard limit, unless the system caps it lower (macOS's
    /// `kern.maxfilesperproc`, as Go does).
    pub soft: u64,
    /// The hard limit, descriptors (unchanged: raising it needs privileges).
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the `rlimit` crate's
/// `increase_nofile_limit`). A process whose soft limit is already the hard one is left as it is.
///
/// # Errors
/// The `getrlimit`/`setrlimit` error (the caller logs it and goes on with the limit it has).
#[cfg(unix)]
pub fn raise_to_hard_limit() -> std::io::Result<OpenFileLimit> {
    let (before, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    let soft = rlimit::increase_nofile_limit(u64::MAX)?;
    Ok(OpenFileLimit { before, soft, hard })
}

/// Raises the open-file limit, then logs it: one `info` line with the soft limit before and after
/// and the hard limit, or a `warn` line naming the error.
pub fn raise_and_log() {
    #[cfg(unix)]
    match raise_to_hard_limit() {
        Ok(limit) => tracing::info!(
            soft = limit.soft,
            hard = limit.hard,
            before = limit.before,
            "open-file limit (RLIMIT_NOFILE): soft limit raised to the hard limit"
        ),
        Err(error) => tracing::warn!(
            %error,
            "cannot raise the open-file limit (RLIMIT_NOFILE); going on with the current one"
        ),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// A lowered soft limit ends at the hard one, and a second raise changes nothing. Lowered to
    /// half the hard limit only, so that the other tests of this process keep enough descriptors.
    /// (The binary's start-up is tested in `tests/plain_ports.rs`.)
    #[test]
    fn a_lowered_soft_limit_is_raised_to_the_hard_limit() {
        let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).expect("getrlimit");
        rlimit::setrlimit(rlimit::Resource::NOFILE, hard / 2, hard).expect("lower the soft limit");
        let raised = raise_to_hard_limit().expect("raise");
        assert_eq!(
            raised,
            OpenFileLimit {
                before: hard / 2,
                soft: hard,
                hard
            }
        );
        assert_eq!(
            rlimit::getrlimit(rlimit::Resource::NOFILE).expect("getrlimit"),
            (hard, hard)
        );
        let again = raise_to_hard_limit().expect("raise again");
        assert_eq!(
            again,
            OpenFileLimit {
                before: hard,
                soft: hard,
                hard
            }
        );
    }
}
