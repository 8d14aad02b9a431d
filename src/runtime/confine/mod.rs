//! Confinement: every process the appliance starts for a tool (an MCP
//! stdio server, a sandboxed tool) starts here, bound to the lease it runs
//! under. Nothing starts a tool process any other way.
//!
//! - CPU, memory and processes: a cgroup of its own under the appliance's
//!   subtree (v2 where the host delegates one, else the v1 controllers),
//!   with the lease's CPUs as a CFS quota, its memory as the hard limit
//!   (swap off) and `runtime.tool_pids_max` processes; the whole tree is
//!   killed when the lease ends. Where no cgroup can be made, resource
//!   limits (`RLIMIT_AS`, `RLIMIT_NPROC`) and a process group, only if
//!   `runtime.when_unconfinable` allows the weaker mechanism.
//! - Network: without internet egress in its lease, a network namespace of
//!   its own with only loopback (and the site endpoints the site allows,
//!   forwarded by the appliance).
//! - Processes: a PID namespace and a `/proc` of its own, where the host
//!   allows (as root, or with unprivileged user namespaces): it sees and
//!   signals no host process.
//! - Files: with Landlock (where the kernel has it), read access to the
//!   system's directories, the directories of its program and of the
//!   program's interpreter, and the paths its release declares that the
//!   site allows; read and write to the attempt's working directory (where
//!   the release's own files are, under `release/`). Nothing is granted at,
//!   above or below a protected path (the data dir, the configuration, TLS,
//!   backups), wherever the grant came from, and nothing ever comes from the
//!   command's arguments.
//! - Environment: only `PATH` ([`TOOL_PATH`]), `LANG`, and `HOME` and
//!   `TMPDIR` set to the working directory; the appliance's own (which may
//!   hold secrets) is not passed on.

pub mod cgroup;
mod sys;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use self::cgroup::{Group, Limits, Root};
use crate::config::{Confinement as Mode, RuntimeConfig, WhenUnconfinable};
use crate::domain::amount::Amount;

/// What a process is started with: its command, its lease's resources and
/// network, and where it works.
pub struct Request<'a> {
    /// A name for its group (unique while it runs).
    pub label: String,
    /// Program and arguments.
    pub argv: &'a [String],
    /// The lease's CPUs.
    pub cpu: Amount,
    /// The lease's memory, GB.
    pub memory_gb: Amount,
    /// Whether the lease allows internet egress.
    pub egress: bool,
    /// The attempt's working directory.
    pub workdir: &'a Path,
    /// Site endpoints offered inside its network, each already allowed by
    /// the site: the `(host, port)` it names, and where the appliance
    /// connects for it.
    pub endpoints: &'a [SiteEndpoint],
    /// Paths its release declares that the site allows it to read.
    pub read_paths: &'a [PathBuf],
}

pub use crate::domain::reach::SiteEndpoint;

/// The `PATH` every tool process gets.
pub const TOOL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What this host can enforce, found once at start.
pub struct Confiner {
    cgroup: Result<Root, String>,
    network: Result<(), String>,
    pid: Result<(), String>,
    landlock: Result<u32, String>,
    work_root: PathBuf,
    protected: Vec<PathBuf>,
    seq: AtomicU64,
}

/// What bound one process tree, and what it used: the timeline shows it
/// per tool call.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Confinement {
    /// `cgroup-v2`, `cgroup-v1` or `rlimit`.
    pub mechanism: String,
    /// Its cgroup, for the cgroup mechanisms.
    pub group: Option<String>,
    /// CPUs it may use (a CFS quota; not enforced by `rlimit`).
    pub cpu: Amount,
    /// Memory it may hold, bytes.
    pub memory_bytes: u64,
    /// Processes and threads it may have.
    pub pids: u32,
    /// `loopback-only`, or `host` (with egress, or where the host cannot
    /// isolate: then why).
    pub network: String,
    /// `own-namespace` (its own PID namespace and `/proc`), or why the
    /// host's processes are visible to it.
    #[serde(default)]
    pub processes: String,
    /// `landlock` (the working directory, the system's and the command's
    /// directories), or why not.
    pub files: String,
    /// The account it runs as.
    pub user: String,
    /// The most memory it held at once, bytes (cgroups only).
    pub peak_memory_bytes: Option<u64>,
    /// CPU time it used, seconds (cgroups only).
    pub cpu_seconds: Option<f64>,
    /// `oom`, `pids` or `timeout` when a limit ended or refused it.
    pub killed_by: Option<String>,
}

/// A running process tree under its limits. Dropping it kills the tree and
/// removes its group.
pub struct Cage {
    group: Option<Group>,
    report: Mutex<Confinement>,
    pgid: AtomicI32,
    /// The Landlock ruleset the child restricts itself with; held until it
    /// has started.
    ruleset: Mutex<Option<OwnedFd>>,
    /// The forwarders of its site endpoints, stopped with it.
    forwards: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The appliance's end of the socket the child sends its site
    /// endpoints' listeners over, with the endpoints, until it started.
    listeners: Mutex<Option<(OwnedFd, OwnedFd, Vec<SiteEndpoint>)>>,
}

/// What the System page and `/readyz` say this host enforces.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostReport {
    /// The mechanism tool processes get: `cgroup-v2`, `cgroup-v1`,
    /// `rlimit`, or `refused` (sandboxed tools are refused).
    pub mechanism: String,
    /// Why not a cgroup, when not.
    pub cgroup_unavailable: Option<String>,
    /// Whether a tool without egress gets a network of its own, or why not.
    pub network: String,
    /// Whether a tool gets a PID namespace of its own, or why not.
    #[serde(default)]
    pub processes: String,
    /// Whether files are restricted (Landlock and its ABI), or why not.
    pub files: String,
}

const GB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The system's directories a tool may read.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/opt", "/proc", "/sys", "/run",
];

/// Device files a tool may read and write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
    "/dev/shm",
];

impl Confiner {
    /// Finds what this host can enforce: a cgroup subtree (v2 if the
    /// host is v2-only and delegates the controllers, else v1), network
    /// and PID namespaces, Landlock. `work_root` holds the attempts'
    /// working directories (inside the data dir); `protected` is never
    /// readable by a tool. Groups go under `agentbay-tools/<instance>`,
    /// one subtree per appliance on the host (named after its data dir):
    /// what a killed run of this appliance left there is ended now.
    pub fn detect(work_root: PathBuf, protected: Vec<PathBuf>) -> Confiner {
        // The appliance's memory and environment (which may hold secrets)
        // are not readable through /proc by tools running as its user.
        // First: the probes below must see the process as its tools will.
        sys::not_dumpable();
        let instance = {
            use sha2::Digest;
            let key = work_root.parent().unwrap_or(&work_root);
            let digest = sha2::Sha256::digest(key.as_os_str().as_encoded_bytes());
            digest[..6]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let (v1, v2) = cgroup::mounts();
        let own = cgroup::own_paths();
        let v2_only = v1.is_empty() && own.len() == 1 && own[0].0.is_empty();
        let cgroup = match (&v2, v2_only) {
            (Some(mount), true) => cgroup::prepare_v2(mount, &own[0].1, &instance),
            _ if !v1.is_empty() => cgroup::prepare_v1(&v1, v2.as_deref(), &own, &instance),
            _ => Err("no cgroup hierarchy is mounted".to_string()),
        };
        let network = Self::probe(sys::Namespaces::for_this_process(true, false))
            .map_err(|e| format!("a network namespace cannot be made here ({e}); needs root or unprivileged user namespaces"));
        let pid = Self::probe(sys::Namespaces::for_this_process(false, true))
            .map_err(|e| format!("a PID namespace with its own /proc cannot be made here ({e}); needs root or unprivileged user namespaces"));
        let landlock = Self::probe_landlock();
        if let Ok(root) = &cgroup {
            // A previous run that was killed left its tools running: they
            // end now, before anything new starts.
            let left = root.groups();
            if !left.is_empty() {
                tracing::warn!(
                    groups = left.len(),
                    "ending tool processes a previous run left behind"
                );
            }
            for g in left {
                g.remove();
            }
        }
        let c = Confiner {
            cgroup,
            network,
            pid,
            landlock,
            work_root,
            protected,
            seq: AtomicU64::new(0),
        };
        c.remove_workdirs();
        let host = c.host(&RuntimeConfig::default());
        tracing::info!(
            mechanism = %host.mechanism,
            cgroup_unavailable = host.cgroup_unavailable.as_deref().unwrap_or("-"),
            network = %host.network,
            processes = %host.processes,
            files = %host.files,
            "tool confinement"
        );
        c
    }

    /// Whether a process can make `namespaces` for itself here.
    fn probe(namespaces: sys::Namespaces) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        let steps = sys::Steps {
            namespaces: Some(namespaces),
            ..sys::Steps::default()
        };
        let mut cmd = std::process::Command::new("/bin/true");
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: Steps::apply makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || steps.apply());
        }
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("a test ended {s}")),
            Err(e) => Err(e.to_string()),
        }
    }

    fn probe_landlock() -> Result<u32, String> {
        // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
        // SAFETY: the documented version query; no memory is passed.
        let abi = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                1u32,
            )
        };
        if abi > 0 {
            Ok(abi as u32)
        } else {
            Err(format!(
                "Landlock is not available in this kernel ({})",
                std::io::Error::last_os_error()
            ))
        }
    }

    /// The cgroup root tool processes get under `config`: a root, none
    /// (the weaker mechanism), or refused with the reason.
    fn cgroup_for(&self, config: &RuntimeConfig) -> Result<Option<&Root>, String> {
        match (&self.cgroup, config.confinement) {
            (_, Mode::Rlimit) => Ok(None),
            (Ok(root), _) => Ok(Some(root)),
            (Err(why), Mode::Cgroup) => Err(format!(
                "runtime.confinement is cgroup and this host has none: {why}"
            )),
            (Err(why), Mode::Auto) if config.when_unconfinable == WhenUnconfinable::Refuse => {
                Err(format!(
                    "this host cannot confine tool processes with a cgroup ({why}) and runtime.when_unconfinable is refuse"
                ))
            }
            (Err(_), Mode::Auto) => Ok(None),
        }
    }

    /// What this host enforces under `config`.
    pub fn host(&self, config: &RuntimeConfig) -> HostReport {
        let mechanism = match self.cgroup_for(config) {
            Ok(Some(root)) => root.mechanism(),
            Ok(None) => "rlimit",
            Err(_) => "refused",
        };
        HostReport {
            mechanism: mechanism.into(),
            cgroup_unavailable: self.cgroup.as_ref().err().cloned(),
            network: match &self.network {
                Ok(()) => "a network namespace with only loopback for tools without egress".into(),
                Err(e) => format!("not isolated: {e}"),
            },
            processes: match &self.pid {
                Ok(()) => "a PID namespace and /proc of its own for every tool".into(),
                Err(e) => format!("not isolated: {e}"),
            },
            files: match &self.landlock {
                Ok(abi) => format!("Landlock (ABI {abi})"),
                Err(e) => format!("not restricted: {e}"),
            },
        }
    }

    /// Ends every tool process tree (the appliance is stopping).
    pub fn end_all(&self) {
        if let Ok(root) = &self.cgroup {
            for g in root.groups() {
                g.remove();
            }
            root.remove();
        }
    }

    /// The working directory of an attempt's tools (made if missing).
    /// Where the host allows it (the appliance runs as root), the
    /// directory is a tmpfs of at most `runtime.tool_workdir_mb`, its pages
    /// charged to the tools that write them.
    pub fn workdir(&self, attempt: &str, config: &RuntimeConfig) -> std::io::Result<PathBuf> {
        let d = self.work_root.join(attempt);
        if !d.exists() {
            std::fs::create_dir_all(&d)?;
            if sys::is_root() {
                sys::mount_tmpfs(&d, config.tool_workdir_mb)?;
            }
            if let Ok(Some((uid, gid))) = Self::tool_user(config) {
                sys::chown(&d, uid, gid)?;
            }
        }
        Ok(d)
    }

    /// The account tools run as: where the appliance runs as root,
    /// `runtime.tool_user` (empty: root, as the appliance); otherwise the
    /// appliance's own user.
    /// A name that is no account is refused by name.
    fn tool_user(config: &RuntimeConfig) -> Result<Option<(libc::uid_t, libc::gid_t)>, String> {
        if !sys::is_root() || config.tool_user.is_empty() {
            return Ok(None);
        }
        sys::account(&config.tool_user).map(Some).ok_or_else(|| {
            format!(
                "runtime.tool_user {:?} is not an account on this host",
                config.tool_user
            )
        })
    }

    /// Whether working directories are size-limited, in words.
    fn workdir_limit(workdir: &Path) -> String {
        match sys::tmpfs_size(workdir) {
            Some(bytes) => format!("a tmpfs of at most {} MiB", bytes >> 20),
            None => "not size-limited (a tmpfs needs the appliance to run as root)".to_string(),
        }
    }

    /// Removes an attempt's working directory.
    pub fn remove_workdir(&self, attempt: &str) {
        let d = self.work_root.join(attempt);
        sys::unmount(&d);
        let _ = std::fs::remove_dir_all(d);
    }

    /// Removes every working directory (at start: what a killed run left).
    fn remove_workdirs(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.work_root) {
            for e in entries.flatten() {
                if let Some(name) = e.file_name().to_str() {
                    self.remove_workdir(name);
                }
            }
        }
    }

    /// A command for `req`, confined, and its cage: spawn the command,
    /// then call [`Cage::started`] with its pid. Refused, with the reason,
    /// where the host cannot enforce what `config` requires.
    pub fn command(
        &self,
        req: &Request<'_>,
        config: &RuntimeConfig,
    ) -> Result<(tokio::process::Command, Cage), String> {
        use std::ffi::CString;
        let Some((program, args)) = req.argv.split_first() else {
            return Err("the tool declares no command".into());
        };
        let refuse = config.when_unconfinable == WhenUnconfinable::Refuse;
        let memory_bytes = (req.memory_gb.as_f64() * GB) as u64;
        let pids = config.tool_pids_max;
        let limits = Limits::of(req.cpu.thousandths(), memory_bytes, pids);
        let mut steps = sys::Steps::default();
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{seq}", req.label);
        let (group, mechanism) = match self.cgroup_for(config)? {
            Some(root) => {
                let group = root
                    .create(&name, limits)
                    .map_err(|e| format!("no cgroup for the tool: {e}"))?;
                steps.join = group
                    .procs_files()
                    .iter()
                    .map(|p| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL"))
                    .collect();
                (Some(group), root.mechanism())
            }
            None => {
                steps.address_space = Some(memory_bytes);
                steps.processes = Some(u64::from(pids));
                (None, "rlimit")
            }
        };
        let mut namespaces = sys::Namespaces::for_this_process(false, false);
        let network = if req.egress {
            "host".to_string()
        } else {
            match &self.network {
                Ok(()) => {
                    namespaces.network = true;
                    "loopback-only".to_string()
                }
                Err(why) if refuse => {
                    return Err(format!(
                        "the tool's lease has no internet egress and this host cannot isolate its network: {why}"
                    ));
                }
                Err(why) => format!("host (not isolated: {why})"),
            }
        };
        let processes = match &self.pid {
            Ok(()) => {
                namespaces.pid = true;
                namespaces.workdir =
                    Path::new(sys::TOOL_WORKDIR)
                        .is_dir()
                        .then_some(())
                        .map(|()| {
                            CString::new(req.workdir.as_os_str().as_encoded_bytes())
                                .expect("no NUL")
                        });
                "own-namespace".to_string()
            }
            Err(why) if refuse => {
                return Err(format!(
                    "this host cannot give a tool a process namespace of its own (it could see and signal the appliance) and runtime.when_unconfinable is refuse: {why}"
                ));
            }
            Err(why) => format!("the host's (not isolated: {why})"),
        };
        let mut listeners = None;
        if namespaces.network && !req.endpoints.is_empty() {
            let (ours, theirs) =
                sys::socket_pair().map_err(|e| format!("no socket for site endpoints: {e}"))?;
            namespaces.listen = req.endpoints.iter().map(|(_, port, _)| *port).collect();
            namespaces.listeners_to = Some(theirs.as_raw_fd());
            listeners = Some((ours, theirs, req.endpoints.to_vec()));
        }
        if namespaces.network || namespaces.pid {
            steps.namespaces = Some(namespaces);
        }
        let (ruleset, files) = match &self.landlock {
            Ok(_) => {
                let (fd, granted) = self.ruleset(program, req.read_paths, req.workdir)?;
                steps.landlock = Some(fd.as_raw_fd());
                (
                    Some(fd),
                    format!(
                        "landlock: read {granted}; write the working directory, {}",
                        Self::workdir_limit(req.workdir)
                    ),
                )
            }
            Err(why) if refuse => {
                return Err(format!(
                    "this host cannot restrict a tool's files and runtime.when_unconfinable is refuse: {why}"
                ));
            }
            Err(why) => (
                None,
                format!(
                    "not restricted: {why}; the working directory is {}",
                    Self::workdir_limit(req.workdir)
                ),
            ),
        };
        // The working directory as the tool sees it.
        let home: &Path = if self.pid.is_ok() && Path::new(sys::TOOL_WORKDIR).is_dir() {
            Path::new(sys::TOOL_WORKDIR)
        } else {
            req.workdir
        };
        steps.user = Self::tool_user(config)?;
        let steps_user = steps.user;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(req.workdir)
            .env_clear()
            .env("PATH", TOOL_PATH)
            .env("LANG", "C.UTF-8")
            .env("HOME", home)
            .env("TMPDIR", home)
            .kill_on_drop(true);
        // SAFETY: Steps::apply makes only async-signal-safe calls on data
        // prepared here.
        unsafe {
            cmd.pre_exec(move || steps.apply());
        }
        let report = Confinement {
            mechanism: mechanism.to_string(),
            group: group.as_ref().map(|g| g.path().display().to_string()),
            cpu: req.cpu,
            memory_bytes,
            pids,
            network,
            processes,
            files,
            user: match steps_user {
                Some(_) => config.tool_user.clone(),
                None if sys::is_root() => "root (runtime.tool_user is empty)".to_string(),
                None => "the appliance's own user".to_string(),
            },
            peak_memory_bytes: None,
            cpu_seconds: None,
            killed_by: None,
        };
        metrics::counter!(crate::telemetry::names::TOOL_PROCESSES, "mechanism" => mechanism)
            .increment(1);
        Ok((
            cmd,
            Cage {
                group,
                report: Mutex::new(report),
                pgid: AtomicI32::new(0),
                ruleset: Mutex::new(ruleset),
                forwards: Mutex::new(Vec::new()),
                listeners: Mutex::new(listeners),
            },
        ))
    }

    /// The Landlock ruleset of a tool: read the system's directories, the
    /// directories of its program and of the program's interpreter, and
    /// the read paths the site allowed; read and write its working
    /// directory and the usual device files. Whatever asked for it, no
    /// read grant is at, above or below a protected path.
    fn ruleset(
        &self,
        program: &str,
        read_paths: &[PathBuf],
        workdir: &Path,
    ) -> Result<(OwnedFd, String), String> {
        use landlock::{
            ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, path_beneath_rules,
        };
        let abi = ABI::V5;
        let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
        if let Ok(entries) = std::fs::read_dir("/etc") {
            read.extend(entries.flatten().map(|e| e.path()));
        }
        // Landlock grants what a path resolves to when the rule is added:
        // the rule below judges the resolved path, so a symbolic link in
        // an allowed directory that points at a protected one grants
        // nothing. A path that does not exist is granted nothing either.
        let own = program_dirs(program, workdir);
        read.extend(
            own.iter()
                .chain(read_paths)
                .filter_map(|p| std::fs::canonicalize(p).ok()),
        );
        read.retain(|r| crate::domain::reach::protected_conflict(r, &self.protected).is_none());
        read.sort();
        read.dedup();
        // In words: the program's and the declared directories by name,
        // the system's as one phrase.
        let named: Vec<String> = read
            .iter()
            .filter(|r| {
                r.exists()
                    && !r.starts_with("/etc")
                    && !SYSTEM_READ.iter().any(|s| Path::new(s) == r.as_path())
            })
            .map(|r| r.display().to_string())
            .collect();
        let granted = if named.is_empty() {
            "the system's directories".to_string()
        } else {
            format!("the system's directories and {}", named.join(", "))
        };
        let err = |e: landlock::RulesetError| format!("no Landlock ruleset: {e}");
        let ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .map_err(err)?
            .create()
            .map_err(err)?
            .add_rules(path_beneath_rules(&read, AccessFs::from_read(abi)))
            .map_err(err)?
            .add_rules(path_beneath_rules(
                DEVICES
                    .iter()
                    .chain(std::iter::once(&workdir.to_str().unwrap_or("/nonexistent"))),
                AccessFs::from_all(abi),
            ))
            .map_err(err)?;
        let fd: Option<OwnedFd> = ruleset.into();
        let fd = fd.ok_or("Landlock is not enforced by this kernel")?;
        Ok((fd, granted))
    }
}

/// The directories a program needs to start: its own (resolved on
/// [`TOOL_PATH`], or against the working directory), and that of the
/// interpreter its `#!` line names (and of what `env` runs).
fn program_dirs(program: &str, workdir: &Path) -> Vec<PathBuf> {
    let resolve = |name: &str| -> Option<PathBuf> {
        if name.contains('/') {
            std::fs::canonicalize(workdir.join(name)).ok()
        } else {
            which(name)
        }
    };
    let mut out = Vec::new();
    let Some(real) = resolve(program) else {
        return out;
    };
    out.extend(real.parent().map(Path::to_path_buf));
    if let Some(line) = shebang(&real) {
        let mut words = line.split_whitespace();
        if let Some(interpreter) = words.next().and_then(resolve) {
            let is_env = interpreter.file_name().is_some_and(|n| n == "env");
            out.extend(interpreter.parent().map(Path::to_path_buf));
            if is_env && let Some(named) = words.find(|w| !w.starts_with('-')).and_then(resolve) {
                out.extend(named.parent().map(Path::to_path_buf));
            }
        }
    }
    out
}

/// The `#!` line of a script, without the `#!`.
fn shebang(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let text = std::str::from_utf8(head.get(..n)?.strip_prefix(b"#!")?).ok()?;
    Some(text.lines().next().unwrap_or("").trim().to_string())
}

/// The program `name` on [`TOOL_PATH`], resolved.
fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(TOOL_PATH)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

impl Cage {
    /// Records the started process (the leader of its process group),
    /// and offers it its site endpoints: the listeners its network made
    /// at `127.0.0.1:<port>`, each connection forwarded by the appliance
    /// to the endpoint's address.
    pub fn started(&self, pid: Option<u32>) -> Result<(), String> {
        if let Some(pid) = pid {
            self.pgid.store(pid as i32, Ordering::Relaxed);
        }
        self.ruleset.lock().take();
        let Some((ours, theirs, endpoints)) = self.listeners.lock().take() else {
            return Ok(());
        };
        drop(theirs);
        let listeners = sys::receive_listeners(&ours, endpoints.len())
            .map_err(|e| format!("the tool's site endpoints cannot be offered to it: {e}"))?;
        let mut forwards = self.forwards.lock();
        for (listener, (_, _, addresses)) in listeners.into_iter().zip(&endpoints) {
            let listener = listener
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpListener::from_std(listener))
                .map_err(|e| format!("a site endpoint cannot be offered to the tool: {e}"))?;
            let addresses = addresses.clone();
            forwards.push(tokio::spawn(async move {
                while let Ok((mut inside, _)) = listener.accept().await {
                    let addresses = addresses.clone();
                    tokio::spawn(async move {
                        if let Ok(mut outside) =
                            tokio::net::TcpStream::connect(&addresses[..]).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                        }
                    });
                }
            }));
        }
        let mut r = self.report.lock();
        r.network = format!(
            "loopback-only, with the site endpoints {} through the appliance",
            endpoints
                .iter()
                .map(|(h, p, _)| crate::domain::reach::Target {
                    host: h.clone(),
                    port: *p,
                    url: None
                }
                .host_port())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    }

    /// What bound the tree and what it used so far.
    pub fn report(&self) -> Confinement {
        let mut r = self.report.lock().clone();
        if let Some(g) = &self.group {
            let used = g.used();
            r.peak_memory_bytes = used.peak_memory_bytes;
            r.cpu_seconds = used.cpu_us.map(|us| us as f64 / 1e6);
            if r.killed_by.is_none() {
                if used.oom_kills > 0 {
                    r.killed_by = Some("oom".into());
                } else if used.pids_refused > 0 {
                    r.killed_by = Some("pids".into());
                }
            }
        }
        r
    }

    /// Kills the whole tree, saying why (`timeout`, `lease-ended`).
    pub fn kill(&self, why: &str) {
        {
            let mut r = self.report.lock();
            if r.killed_by.is_none() && why != "lease-ended" {
                r.killed_by = Some(why.to_string());
                metrics::counter!(crate::telemetry::names::TOOL_KILLS, "reason" => why.to_string())
                    .increment(1);
            }
        }
        match &self.group {
            Some(g) => g.kill(),
            None => sys::kill_group(self.pgid.load(Ordering::Relaxed)),
        }
    }
}

impl Drop for Cage {
    fn drop(&mut self) {
        for f in self.forwards.lock().drain(..) {
            f.abort();
        }
        let report = self.report();
        if let Some(reason) = &report.killed_by
            && self.report.lock().killed_by.is_none()
        {
            metrics::counter!(crate::telemetry::names::TOOL_KILLS, "reason" => reason.clone())
                .increment(1);
        }
        match &self.group {
            Some(g) => g.remove(),
            None => sys::kill_group(self.pgid.load(Ordering::Relaxed)),
        }
    }
}
