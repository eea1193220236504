//! Upstream's half: the Go program `tests/upstream/cmd/cidrset-driver` (built by
//! `tests/upstream/build.sh` into the folder `$NODEIPAM_UPSTREAM_BIN`), run as one long-lived
//! process per batch of sequences — Go starts once, not once per request.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::protocol::{Op, to_text};

/// The environment variable naming the folder of the built Go drivers.
pub const UPSTREAM_BIN_ENV: &str = "NODEIPAM_UPSTREAM_BIN";

/// The Go driver's file name in that folder.
pub const DRIVER_NAME: &str = "cidrset-driver";

/// Why upstream's driver could not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// `$NODEIPAM_UPSTREAM_BIN` is not set.
    #[error(
        "{UPSTREAM_BIN_ENV} is not set: build the Go drivers with tests/upstream/build.sh and set \
         {UPSTREAM_BIN_ENV} to the folder it prints on its last line"
    )]
    NotConfigured,
    /// The driver is not in that folder.
    #[error(
        "{path} is missing: tests/upstream/build.sh builds it (is {UPSTREAM_BIN_ENV} the folder \
         build.sh printed?)"
    )]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// Starting it, writing to it or reading from it failed.
    #[error("running {path}: {source}")]
    Io {
        /// The driver.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// It exited early or answered a different number of lines than it was sent requests.
    #[error(
        "{path} answered {answered} lines to {sent} requests and exited with {status}; its \
         stderr: {stderr}"
    )]
    Incomplete {
        /// The driver.
        path: PathBuf,
        /// Requests sent.
        sent: usize,
        /// Lines answered.
        answered: usize,
        /// Its exit status.
        status: String,
        /// What it wrote on stderr.
        stderr: String,
    },
}

/// Upstream's cidrset driver.
#[derive(Debug, Clone)]
pub struct UpstreamDriver {
    path: PathBuf,
}

impl UpstreamDriver {
    /// The driver at `$NODEIPAM_UPSTREAM_BIN/cidrset-driver`.
    ///
    /// # Errors
    /// [`UpstreamError::NotConfigured`] or [`UpstreamError::Missing`], with what to do.
    pub fn from_env() -> Result<UpstreamDriver, UpstreamError> {
        let dir = std::env::var_os(UPSTREAM_BIN_ENV).ok_or(UpstreamError::NotConfigured)?;
        UpstreamDriver::at(PathBuf::from(dir).join(DRIVER_NAME))
    }

    /// The driver at `path`.
    ///
    /// # Errors
    /// [`UpstreamError::Missing`] if `path` is not a file.
    pub fn at(path: PathBuf) -> Result<UpstreamDriver, UpstreamError> {
        if path.is_file() {
            Ok(UpstreamDriver { path })
        } else {
            Err(UpstreamError::Missing { path })
        }
    }

    /// Runs every sequence of `batch`, in order, through one process and returns each one's
    /// answers (one per request). The requests are written from a second thread while the
    /// answers are read, so neither pipe fills up.
    ///
    /// # Errors
    /// [`UpstreamError::Io`] or [`UpstreamError::Incomplete`].
    pub fn run_batch(&self, batch: &[Vec<Op>]) -> Result<Vec<Vec<String>>, UpstreamError> {
        let io = |source| UpstreamError::Io {
            path: self.path.clone(),
            source,
        };
        let mut child = Command::new(&self.path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io)?;
        let sent: usize = batch.iter().map(Vec::len).sum();
        let mut text = String::new();
        for sequence in batch {
            text.push_str(&to_text(sequence));
        }
        let (Some(mut stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(io(std::io::Error::other(
                "the child's pipes were not set up",
            )));
        };
        let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
        let stderr_reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut lines = Vec::with_capacity(sent);
        for line in BufReader::new(stdout).lines() {
            lines.push(line.map_err(io)?);
        }
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the writer thread panicked")));
        let status = child.wait().map_err(io)?;
        let stderr = stderr_reader.join().unwrap_or_default();
        if lines.len() != sent || !status.success() || written.is_err() {
            return Err(UpstreamError::Incomplete {
                path: self.path.clone(),
                sent,
                answered: lines.len(),
                status: status.to_string(),
                stderr,
            });
        }
        let mut answers = Vec::with_capacity(batch.len());
        let mut rest = lines.into_iter();
        for sequence in batch {
            answers.push(rest.by_ref().take(sequence.len()).collect());
        }
        Ok(answers)
    }
}
