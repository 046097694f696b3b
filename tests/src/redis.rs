//! A real `redis-server` for the scale-out tests, and [`Replicas`]: several
//! `socialgate serve` processes sharing it.
//!
//! [`RedisServer`] runs on a free 127.0.0.1 port in its own scratch folder,
//! with the persistence the docs ask of operators (AOF, `appendfsync
//! always`), and can be killed with SIGKILL and started again from its AOF
//! on the same port. When `redis-server` is missing it is installed first
//! by `scripts/install-redis.sh` (under a lock, so parallel test binaries
//! install once): the tests are never skipped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::api::{Answer, Api};
use crate::config::{standard_env, Config, ConfigBuilder};
use crate::paths;
use crate::process::{run_cli, Server};
use crate::upstream::{FallbackMock, PrimaryMock};

/// The variables the replicas read their Redis URL and cursor key from.
pub const REDIS_URL_ENV: &str = "SG_TEST_REDIS_URL";
pub const CURSOR_KEY_ENV: &str = "SG_TEST_CURSOR_KEY";
const CURSOR_KEY: &str = "a-cursor-key-every-replica-shares-0123456789";

/// The password every test server requires: the URL carries it, so the
/// tests can check that it appears in no log.
pub const PASSWORD: &str = "sg-test-redis-password-7c1f";

/// How long Redis may take to answer its first PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Installs `redis-server` with the project's script when it is missing.
fn ensure_installed() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let found = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            return;
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-redis.sh");
        let status = Command::new("bash")
            .arg(&script)
            .status()
            .expect("can run scripts/install-redis.sh");
        assert!(
            status.success(),
            "scripts/install-redis.sh could not install redis-server"
        );
    });
}

/// A running `redis-server`, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one on a free port, AOF on, every write synced.
    pub fn start() -> RedisServer {
        ensure_installed();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = RedisServer {
            child: None,
            port,
            dir: paths::scratch_dir(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("redis.log")).expect("a log file");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--daemonize", "no", "--requirepass", PASSWORD])
            .stdout(Stdio::from(log.try_clone().expect("a log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("can start redis-server");
        self.child = Some(child);
        let started = Instant::now();
        while !self.pings() {
            assert!(
                started.elapsed() < START_TIMEOUT,
                "redis-server did not answer within {START_TIMEOUT:?}: {}",
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers `PING` (and has loaded its data: a loading
    /// server answers `-LOADING`).
    fn pings(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut reply = [0u8; 12];
        let ask = format!("AUTH {PASSWORD}\r\nPING\r\n");
        stream.write_all(ask.as_bytes()).is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+OK\r\n+PONG\r\n"
    }

    /// Runs one command (after `AUTH`) and answers Redis's raw reply, for
    /// setting up what no replica can make, such as a dead replica's
    /// reservation.
    pub fn command(&self, args: &[&str]) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("redis answers");
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("a timeout");
        let mut ask = format!("AUTH {PASSWORD}\r\n*{}\r\n", args.len());
        for arg in args {
            ask.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream
            .write_all(ask.as_bytes())
            .expect("redis takes the command");
        // `+OK` for AUTH, then the reply: read until a line of it has come
        // whole, which is all of the one-line replies the tests ask for.
        let mut reply = vec![0u8; 4096];
        let mut got = 0;
        while got <= 5 || !reply[..got].ends_with(b"\r\n") {
            let n = stream.read(&mut reply[got..]).expect("a reply from redis");
            assert!(n > 0, "redis closed the connection");
            got += n;
        }
        let reply = String::from_utf8_lossy(&reply[..got]);
        let answer = reply.strip_prefix("+OK\r\n");
        answer
            .unwrap_or_else(|| panic!("AUTH refused: {reply:?}"))
            .to_owned()
    }

    pub fn url(&self) -> String {
        format!("redis://:{PASSWORD}@127.0.0.1:{}/0", self.port)
    }

    /// SIGKILL: no chance to write anything more.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and folder, from its AOF.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Its data folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `replicas` `socialgate serve` processes on one Redis, each with its
/// own copy of the same config (own folder: plugin copies, output), both
/// upstream doubles, and round-robin clients.
pub struct Replicas {
    pub servers: Vec<Server>,
    pub configs: Vec<Config>,
    pub redis: RedisServer,
    pub primary: PrimaryMock,
    pub fallback: FallbackMock,
    env: Vec<(String, String)>,
}

impl Replicas {
    /// Starts Redis, the doubles and `count` replicas of the default
    /// operator config plus `extra` (TOML appended: `[rate_limit]`,
    /// `[billing]`, ...), with `[state] backend = "redis"` and the cache on.
    pub async fn start(count: usize, extra: &str) -> Replicas {
        paths::require_plugin("shortvideo_primary");
        paths::require_plugin("shortvideo_fallback");
        let redis = RedisServer::start();
        let primary = PrimaryMock::start().await;
        let fallback = FallbackMock::start().await;
        let mut env = standard_env();
        env.push((REDIS_URL_ENV.into(), redis.url()));
        env.push((CURSOR_KEY_ENV.into(), CURSOR_KEY.into()));
        let builder = ConfigBuilder::new()
            .platform(
                "shortvideo",
                "live",
                &[crate::config::PRIMARY, crate::config::FALLBACK],
            )
            .endpoint_order("shortvideo", "search", &[crate::config::FALLBACK])
            .primary(&primary.base_url())
            .fallback(&fallback.base_url())
            .server_line(&format!("cursor_key_env = \"{CURSOR_KEY_ENV}\""))
            .cache("enabled = true")
            .raw(&format!(
                "[state]\nbackend = \"redis\"\nurl_env = \"{REDIS_URL_ENV}\"\n{extra}"
            ));
        let configs: Vec<Config> = (0..count).map(|_| builder.write()).collect();
        let servers = configs
            .iter()
            .map(|config| Server::start_with(config, &env, &[]))
            .collect();
        Replicas {
            servers,
            configs,
            redis,
            primary,
            fallback,
            env,
        }
    }

    /// The environment every replica and command runs with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// `socialgate ARGS` on the first replica's config (the shared store).
    pub fn cli(&self, args: &[&str]) -> crate::process::CliOutput {
        run_cli(&self.configs[0], &self.env, args)
    }

    /// Issues a key in the shared store.
    pub fn issue(&self, name: &str) -> String {
        let out = self.cli(&["keys", "issue", "--name", name]);
        assert!(out.success(), "keys issue: {}", out.stderr);
        out.stdout.trim().to_owned()
    }

    /// Issues a key and waits (at most 2 s) until every replica accepts it.
    pub async fn issue_everywhere(&self, name: &str) -> String {
        let key = self.issue(name);
        for i in 0..self.servers.len() {
            let api = self.api(i, &key);
            // A path past the key check that costs nothing: 404.
            let known = crate::stack::eventually(Duration::from_secs(2), || async {
                api.get("/v1/shortvideo/nothing").await.status == 404
            });
            assert!(
                known.await,
                "replica {i} did not see key `{name}` within 2 s"
            );
        }
        key
    }

    /// A client of replica `i` holding `key`.
    pub fn api(&self, i: usize, key: &str) -> Api {
        Api::new(&self.servers[i].base_url(), Some(key))
    }

    /// `GET path` on replica `n % count` with `key`: round-robin.
    pub async fn get(&self, n: usize, key: &str, path: &str) -> Answer {
        self.api(n % self.servers.len(), key).get(path).await
    }

    /// `/readyz`'s status of replica `i`.
    pub async fn readiness(&self, i: usize) -> (u16, String) {
        let answer = Api::new(&self.servers[i].base_url(), None)
            .get("/readyz")
            .await;
        let status = answer.json["status"].as_str().unwrap_or("").to_owned();
        (answer.status, status)
    }

    /// Redis's append-only files, for checking it persists.
    pub fn aof_dir(&self) -> PathBuf {
        self.redis.dir().to_owned()
    }
}
