//! A throwaway PostgreSQL cluster for tests: Debian's packaged server,
//! initialised in a temporary directory, listening on a free loopback
//! port, run as the `postgres` account when the tests run as root (the
//! server refuses root), and killed with the test process.
//!
//! Used by the store's own suite (`src/store/tests.rs`) and by the
//! integration tests; each test takes a database of its own.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How a restart stops the server (`pg_ctl restart -m fast|immediate`).
#[derive(Clone, Copy, Debug)]
pub enum Shutdown {
    Fast,
    Immediate,
}

/// A running cluster.
pub struct PgCluster {
    /// Kept until the process exits.
    dir: PathBuf,
    pub port: u16,
    bin: PathBuf,
    /// The account the server runs as: (uid, gid), `None` when the tests
    /// are not root.
    account: Option<(u32, u32)>,
    server: Mutex<Option<Child>>,
    fsync: bool,
}

/// Whether a packaged PostgreSQL server is installed.
pub fn installed() -> bool {
    std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("bin/initdb").exists())
}

/// The directory of the newest packaged PostgreSQL's programs.
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server is installed (/usr/lib/postgresql/<version>/bin/initdb); \
             the PostgreSQL store's tests need Debian's postgresql package (apt-get install postgresql-15)"
        )
    })
}

/// The `postgres` account's uid and gid, when the tests run as root.
fn account() -> Option<(u32, u32)> {
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("reading /etc/passwd");
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("the postgres account (created by Debian's postgresql package)");
    let fields: Vec<&str> = line.split(':').collect();
    Some((fields[2].parse().unwrap(), fields[3].parse().unwrap()))
}

/// A command run as `account`, killed when the test process dies.
fn command(program: &Path, account: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = account
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            // After the change of account, which clears it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd
}

/// Spawns `cmd` from a thread that lives as long as the process: the
/// kernel sends the parent-death signal when the spawning *thread* ends,
/// and a test's thread ends with the test.
fn spawn_for_the_process(cmd: Command) -> Child {
    type Request = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Request>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
            // Never reached while the process runs: the sender is static.
            std::thread::park();
        });
        Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    spawner.lock().unwrap().send((cmd, reply)).unwrap();
    answer.recv().unwrap().expect("starting postgres")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl PgCluster {
    /// The cluster this test process shares (fsync off: its tests never
    /// kill the server).
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| {
            let cluster = PgCluster::start(false);
            cluster.remove_at_exit();
            cluster
        })
    }

    /// For a cluster kept in a static, which is never dropped: its
    /// directory is removed when the process exits (the server is killed
    /// with the process).
    pub fn remove_at_exit(&self) {
        static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
        extern "C" fn remove_dirs() {
            if let Ok(dirs) = DIRS.lock() {
                for dir in dirs.iter() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
        let mut dirs = DIRS.lock().unwrap();
        if dirs.is_empty() {
            // SAFETY: registers a plain function to run at exit.
            unsafe { libc::atexit(remove_dirs) };
        }
        dirs.push(self.dir.clone());
    }

    /// A new cluster of one's own, with fsync on, for tests that kill
    /// or restart the server.
    pub fn start(fsync: bool) -> PgCluster {
        let bin = bin_dir();
        let account = account();
        let dir = tempfile::Builder::new()
            .prefix("agentbay-pg")
            .tempdir()
            .unwrap()
            .keep();
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let out = command(&bin.join("initdb"), account)
            .args([
                "-A",
                "trust",
                "-U",
                "agentbay",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "-D",
            ])
            .arg(dir.join("data"))
            .stdout(Stdio::null())
            .output()
            .expect("running initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = PgCluster {
            dir,
            port: free_port(),
            bin,
            account,
            server: Mutex::new(None),
            fsync,
        };
        cluster.run();
        cluster
    }

    /// Starts the server and waits until it takes connections.
    fn run(&self) {
        let log = std::fs::File::create(self.dir.join("server.log")).unwrap();
        if let Some((uid, gid)) = self.account {
            std::os::unix::fs::chown(self.dir.join("server.log"), Some(uid), Some(gid)).unwrap();
        }
        let mut cmd = command(&self.bin.join("postgres"), self.account);
        cmd.arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1"]);
        if !self.fsync {
            // The shared cluster: many tests' connections at once, and
            // little memory. A cluster with fsync on keeps PostgreSQL's
            // defaults, so the benches measure what a site starts with.
            cmd.args([
                "-c",
                "fsync=off",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=32MB",
            ]);
        }
        cmd.stdout(Stdio::null()).stderr(log);
        let child = spawn_for_the_process(cmd);
        *self.server.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not start: {}",
                std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server and starts it again `down` later, as `pg_ctl
    /// restart -m MODE` does (the same signals to the postmaster; a
    /// failover leaves a pause): how long it took until the server took
    /// connections again.
    pub fn restart(&self, mode: Shutdown, down: Duration) -> Duration {
        let started = Instant::now();
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let signal = match mode {
                // Sessions are ended (admin shutdown), a checkpoint is
                // written.
                Shutdown::Fast => libc::SIGINT,
                // As a crash: no checkpoint, recovery at the start.
                Shutdown::Immediate => libc::SIGQUIT,
            };
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, signal) };
            let _ = child.wait();
        }
        std::thread::sleep(down);
        self.run();
        started.elapsed()
    }

    /// Runs SQL as the cluster's superuser, in database `postgres`.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// Runs SQL as the cluster's superuser in the database of `url` (as
    /// [`PgCluster::database`] made it) or of that name.
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        let name = database
            .rsplit('/')
            .next()
            .unwrap_or(database)
            .split('?')
            .next()
            .unwrap_or(database);
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "agentbay",
            ])
            .args([
                "-d",
                name,
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("running psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A new empty database; its connection URL.
    pub fn database(&self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.psql(&format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// The server's Unix-domain socket (where `peer` authentication
    /// applies).
    pub fn socket(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }

    pub fn url(&self, database: &str) -> String {
        format!(
            "postgresql://agentbay@127.0.0.1:{}/{database}?sslmode=disable",
            self.port
        )
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
