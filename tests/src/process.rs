//! Running the real binary: `serve` as a [`Server`] that is killed when
//! dropped, and one-shot commands (`keys`, `check`) with a bounded wait.
//!
//! Output goes to files in the config's scratch folder, never to pipes that
//! could fill up; `serve`'s stdout is a pipe read by a thread, for the
//! `listening on` line.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::{standard_env, Config};
use crate::paths;

/// How long a server may take to print its `listening on` line, and a
/// one-shot command to exit.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(20);

/// The exact prefix of the line `serve` prints once bound.
pub const LISTENING_PREFIX: &str = "listening on http://";

/// The same line when the public listener serves TLS.
pub const TLS_LISTENING_PREFIX: &str = "listening on https://";

/// The exact prefix of the line `serve` prints for the admin listener.
pub const ADMIN_LISTENING_PREFIX: &str = "admin listening on http://";

static OUTPUT_FILES: AtomicUsize = AtomicUsize::new(0);

/// A fresh file name in the config's folder for captured output.
fn output_file(config: &Config, label: &str) -> PathBuf {
    let n = OUTPUT_FILES.fetch_add(1, Ordering::Relaxed);
    config.dir().join(format!("{label}-{n}.log"))
}

/// `socialgate ARGS --config PATH`, or with a `prelude`, a shell that runs
/// the prelude and then `exec`s the binary: the same process, so `$$` in
/// the prelude is the binary's PID, and what it sets (`umask 000`) holds.
fn base_command(
    config: &Config,
    env: &[(String, String)],
    args: &[&str],
    prelude: Option<&str>,
) -> Command {
    let mut cmd = match prelude {
        None => Command::new(paths::socialgate_bin()),
        Some(prelude) => {
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(format!("{prelude}\nexec \"$0\" \"$@\""))
                .arg(paths::socialgate_bin());
            sh
        }
    };
    cmd.args(args)
        .arg("--config")
        .arg(config.path())
        .current_dir(config.dir())
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The non-empty lines of stderr.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Asserts the command failed with an exit code (not a signal) and
    /// returns its last non-empty stderr line, where the reason belongs.
    pub fn refusal_line(&self, what: &str) -> &str {
        assert!(
            !self.status.success(),
            "{what}: expected a failure, got {}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        assert!(
            self.status.code().is_some(),
            "{what}: expected an exit code, the process died by a signal: {}\nstderr: {}",
            self.status,
            self.stderr
        );
        self.stderr_lines()
            .last()
            .copied()
            .unwrap_or_else(|| panic!("{what}: failed without a word on stderr"))
    }

    /// Asserts stderr holds exactly one non-empty line.
    pub fn assert_one_stderr_line(&self, what: &str) {
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "{what}: expected exactly one stderr line, got {}:\n{}",
            lines.len(),
            self.stderr
        );
    }
}

/// Waits for `child` to exit, killing it after [`PROCESS_TIMEOUT`].
fn wait_bounded(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    loop {
        match child.try_wait().expect("can poll the child") {
            Some(status) => return status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{what}` did not exit within {PROCESS_TIMEOUT:?}");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Runs `socialgate ARGS --config PATH` with `env` and waits for it.
pub fn run_cli(config: &Config, env: &[(String, String)], args: &[&str]) -> CliOutput {
    run_cli_after(config, env, None, args)
}

/// [`run_cli`], with a shell `prelude` run first in the same process (see
/// [`Server::start_after`]).
pub fn run_cli_after(
    config: &Config,
    env: &[(String, String)],
    prelude: Option<&str>,
    args: &[&str],
) -> CliOutput {
    let out_path = output_file(config, "cli-stdout");
    let err_path = output_file(config, "cli-stderr");
    let mut child = base_command(config, env, args, prelude)
        .stdout(File::create(&out_path).expect("can create the stdout file"))
        .stderr(File::create(&err_path).expect("can create the stderr file"))
        .spawn()
        .expect("can start socialgate");
    let status = wait_bounded(&mut child, &args.join(" "));
    CliOutput {
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Issues a key named `name` through the CLI and returns it.
pub fn issue_key(config: &Config, name: &str) -> String {
    let out = run_cli(config, &standard_env(), &["keys", "issue", "--name", name]);
    assert!(
        out.success(),
        "`keys issue --name {name}` failed: {}\nstderr: {}",
        out.status,
        out.stderr
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "`keys issue` must print the key alone on one line, printed: {:?}",
        out.stdout
    );
    let key = lines[0].trim();
    assert!(
        !key.is_empty() && !key.contains(char::is_whitespace),
        "`keys issue` printed no usable key: {:?}",
        out.stdout
    );
    key.to_owned()
}

/// A running `socialgate serve`, killed when dropped. When the test is
/// failing, its stderr is printed on drop.
pub struct Server {
    child: Child,
    addr: SocketAddr,
    stderr_path: PathBuf,
    more_stdout: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `serve` with the standard environment; panics if it does not
    /// come up.
    pub fn start(config: &Config) -> Server {
        Server::start_with(config, &standard_env(), &[])
    }

    /// Starts `serve` with `env` and extra arguments; panics if it does not
    /// come up.
    pub fn start_with(config: &Config, env: &[(String, String)], extra: &[&str]) -> Server {
        match Server::try_start(config, env, extra) {
            Ok(server) => server,
            Err(out) => panic!(
                "the server exited instead of listening: {}\nstdout: {}\nstderr: {}\nconfig:\n{}",
                out.status,
                out.stdout,
                out.stderr,
                config.text()
            ),
        }
    }

    /// Starts `serve` with `env` after a shell `prelude` run in the same
    /// process: `$$` in it is the server's PID (to plant a file where the
    /// server will write), and what it sets (`umask 000`) is the server's.
    /// Panics if the server does not come up.
    pub fn start_after(config: &Config, env: &[(String, String)], prelude: &str) -> Server {
        Server::spawn(config, env, &[], Some(prelude)).unwrap_or_else(|out| {
            panic!(
                "the server exited instead of listening: {}\nstderr: {}",
                out.status, out.stderr
            )
        })
    }

    /// Starts `serve`; `Err` with its output when it exits instead of
    /// printing the `listening on` line. Panics if it does neither within
    /// [`PROCESS_TIMEOUT`] or prints something else first.
    pub fn try_start(
        config: &Config,
        env: &[(String, String)],
        extra: &[&str],
    ) -> Result<Server, CliOutput> {
        Server::spawn(config, env, extra, None)
    }

    fn spawn(
        config: &Config,
        env: &[(String, String)],
        extra: &[&str],
        prelude: Option<&str>,
    ) -> Result<Server, CliOutput> {
        let stderr_path = output_file(config, "serve-stderr");
        let mut args = vec!["serve"];
        args.extend_from_slice(extra);
        let mut child = base_command(config, env, &args, prelude)
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_path).expect("can create the stderr file"))
            .spawn()
            .expect("can start socialgate serve");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (lines_tx, lines_rx) = mpsc::channel::<String>();
        let more_stdout = Arc::new(Mutex::new(Vec::new()));
        let more = Arc::clone(&more_stdout);
        std::thread::spawn(move || {
            let mut first = true;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if first {
                    first = false;
                    if lines_tx.send(line).is_err() {
                        break;
                    }
                } else {
                    more.lock().expect("not poisoned").push(line);
                }
            }
        });
        let stderr_of = |path: &PathBuf| std::fs::read_to_string(path).unwrap_or_default();
        match lines_rx.recv_timeout(PROCESS_TIMEOUT) {
            Ok(line) => {
                let addr = line
                    .strip_prefix(LISTENING_PREFIX)
                    .or_else(|| line.strip_prefix(TLS_LISTENING_PREFIX));
                let Some(addr) = addr else {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "serve's first stdout line must be `{LISTENING_PREFIX}ADDR`, got {line:?}\nstderr: {}",
                        stderr_of(&stderr_path)
                    );
                };
                let addr: SocketAddr = addr.parse().unwrap_or_else(|_| {
                    panic!("serve printed an address that does not parse: {line:?}")
                });
                assert!(
                    addr.ip().is_loopback() && addr.port() != 0,
                    "serve must print the real bound address, printed {line:?}"
                );
                Ok(Server {
                    child,
                    addr,
                    stderr_path,
                    more_stdout,
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = wait_bounded(&mut child, "serve");
                Err(CliOutput {
                    status,
                    stdout: String::new(),
                    stderr: stderr_of(&stderr_path),
                })
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "serve printed no `listening on` line within {PROCESS_TIMEOUT:?}\nstderr: {}",
                    stderr_of(&stderr_path)
                );
            }
        }
    }

    /// The bound address from the `listening on` line.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Everything the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Stdout lines after the `listening on` line.
    pub fn extra_stdout(&self) -> Vec<String> {
        self.more_stdout.lock().expect("not poisoned").clone()
    }

    /// Stops the process and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process ID, for signals and `/proc/<pid>/status`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the process ended, or `None` while it runs.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let stderr = self.stderr();
            let tail: String = {
                let chars: Vec<char> = stderr.chars().collect();
                chars[chars.len().saturating_sub(6000)..].iter().collect()
            };
            eprintln!(
                "--- server {} stderr (tail) ---\n{tail}\n--- end ---",
                self.addr
            );
        }
    }
}
