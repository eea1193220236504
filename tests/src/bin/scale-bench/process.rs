//! The two child processes of a run (sandbox API server, controller): spawning, reading their
//! `/proc` figures, stopping them with SIGTERM.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Peak and current resident set and CPU time of a process, from `/proc/PID/status` (`VmHWM`,
/// `VmRSS`, `RssAnon`, `RssFile`, kB) and `/proc/PID/stat` (`utime + stime`, clock ticks, summed
/// over all threads).
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Peak resident set size (`VmHWM`), bytes.
    pub peak_rss: u64,
    /// Resident set size now (`VmRSS`), bytes.
    pub rss: u64,
    /// Anonymous part of `rss` (heap, stacks), bytes.
    pub rss_anon: u64,
    /// File-backed part of `rss` (the binary's pages, shared libraries), bytes.
    pub rss_file: u64,
    /// User + system CPU time, seconds.
    pub cpu_s: f64,
}

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`; 100 on Linux x86_64).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// The figures of process `pid` now (`None` if it is gone).
pub fn usage(pid: u32, ticks_per_s: f64) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may contain spaces):
    // state is field 3, utime field 14, stime field 15.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu = ticks(11) + ticks(12);
    Some(Usage {
        peak_rss: kb("VmHWM:"),
        rss: kb("VmRSS:"),
        rss_anon: kb("RssAnon:"),
        rss_file: kb("RssFile:"),
        cpu_s: cpu as f64 / ticks_per_s,
    })
}

/// Moments at which a child printed a line containing one of the watched texts (the first
/// occurrence of each), measured from the run's start.
#[derive(Debug, Default)]
pub struct Marks {
    seen: Mutex<Vec<(&'static str, Duration)>>,
}

impl Marks {
    /// When `text` was first seen, if it was.
    pub fn get(&self, text: &str) -> Option<Duration> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(t, _)| *t == text)
            .map(|(_, at)| *at)
    }

    /// How many distinct watched texts have been seen.
    pub fn count(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn record(&self, text: &'static str, at: Duration) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if !seen.iter().any(|(t, _)| *t == text) {
            seen.push((text, at));
        }
    }
}

/// A running child: killed (SIGKILL) on drop if still running.
pub struct Running {
    child: Child,
    /// Its log lines' first occurrences of the watched texts.
    pub marks: Arc<Marks>,
    /// Where its stderr (and stdout) go.
    pub log: PathBuf,
    /// How many texts are watched for.
    pub watched: usize,
}

impl Running {
    /// Spawns `program args`, its stdout and stderr copied line by line into `log`; the first
    /// line that contains each of `watch` is time-stamped (relative to `start`) in
    /// [`Running::marks`]. Returns the first stdout line too if `first_stdout_line`.
    ///
    /// # Errors
    /// The spawn error, or no first line (the process exited at once).
    pub fn spawn(
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: PathBuf,
        watch: &'static [&'static str],
        start: Instant,
        first_stdout_line: bool,
    ) -> Result<(Running, Option<String>), String> {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let file = Arc::new(Mutex::new(std::io::BufWriter::new(file)));
        let marks = Arc::new(Marks::default());
        let stderr = child.stderr.take().ok_or("no stderr pipe")?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        copy_lines(stderr, file.clone(), marks.clone(), watch, start, None);
        let first = if first_stdout_line {
            let (tx, rx) = std::sync::mpsc::channel();
            copy_lines(stdout, file, marks.clone(), watch, start, Some(tx));
            Some(rx.recv_timeout(Duration::from_secs(600)).map_err(|_| {
                let _ = child.kill();
                format!("{} printed no line within 600 s", program.display())
            })?)
        } else {
            copy_lines(stdout, file, marks.clone(), watch, start, None);
            None
        };
        Ok((
            Running {
                child,
                marks,
                log,
                watched: watch.len(),
            },
            first,
        ))
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM and waits up to `grace` for the exit (then SIGKILL). Returns the exit status
    /// text and the last [`Usage`] read before the exit (every 10 ms while it shuts down, so its
    /// `peak_rss` includes the shutdown).
    pub fn terminate(mut self, grace: Duration, ticks_per_s: f64) -> (String, Option<Usage>) {
        let pid = self.child.id();
        let mut last = usage(pid, ticks_per_s);
        if let Some(status) = self.exited() {
            return (status.to_string(), last);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return (status.to_string(), last);
            }
            if let Some(now) = usage(pid, ticks_per_s).filter(|u| u.peak_rss > 0) {
                last = Some(now);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let status = match self.child.wait() {
            Ok(status) => format!("{status} (killed after {grace:?})"),
            Err(e) => format!("killed; wait failed: {e}"),
        };
        (status, last)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn copy_lines(
    pipe: impl std::io::Read + Send + 'static,
    file: Arc<Mutex<std::io::BufWriter<std::fs::File>>>,
    marks: Arc<Marks>,
    watch: &'static [&'static str],
    start: Instant,
    mut first: Option<std::sync::mpsc::Sender<String>>,
) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let at = start.elapsed();
            for text in watch {
                if line.contains(text) {
                    marks.record(text, at);
                }
            }
            if let Some(tx) = first.take() {
                let _ = tx.send(line.clone());
            }
            let _ = file
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .write_all(line.as_bytes());
        }
        let _ = file.lock().unwrap_or_else(PoisonError::into_inner).flush();
    });
}

/// A free TCP port on 127.0.0.1 (bound and released; another process could take it in between,
/// which a benchmark on a quiet machine accepts).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// The 1-minute load average (`/proc/loadavg`).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}
