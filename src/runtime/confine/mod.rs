//! Confinement: every process the appliance starts for a tool (an MCP
//! stdio server, a sandboxed tool) starts here, bound to the lease it runs
//! under. Nothing starts a tool process any other way.
//!
//! A tool lives in a world built for it, not in the host with exceptions
//! listed:
//!
//! - Files: its own mount namespace whose root is a fresh tmpfs holding,
//!   read-only, the system's directories ([`SYSTEM`]), the directories of
//!   its program and of the program's interpreter, its release's files and
//!   the paths its release declares that the site allows; read-write, its
//!   attempt's working directory (at [`TOOL_WORKDIR`]) and a `/tmp` of its
//!   own; a `/dev` of six devices and a `/proc` of its own. Nothing else of
//!   the host exists for it: not `/run`, `/var`, `/home`, the data dir, and
//!   no socket or device outside that list. Nothing is granted at, above or
//!   below a protected path (the data dir, the configuration, TLS,
//!   backups), wherever the grant came from; one below a system directory
//!   is masked. Nothing ever comes from the command's arguments. Landlock,
//!   where the kernel has it, is a second layer over the same grants.
//! - System calls: a seccomp filter ([`filter`]): no sockets but IP and
//!   `socketpair`, no ptrace, keyctl, bpf, mounts or new namespaces.
//! - Identity: never the appliance's uid. As root, `runtime.tool_user` or
//!   a uid of its own per attempt from `runtime.tool_uid_range`; as an
//!   unprivileged account, a uid of its own per attempt from the account's
//!   subordinate range (`/etc/subuid`, mapped once with `newuidmap` into a
//!   user namespace every tool joins). Without a range the receipt says it
//!   shares the appliance's uid.
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
//! - Processes: a PID namespace: it sees and signals no host process.
//! - Environment: only `PATH` ([`TOOL_PATH`]), `LANG`, `HOME` (its working
//!   directory) and `TMPDIR`; the appliance's own (which may hold secrets)
//!   is not passed on.
//!
//! Where the host cannot give one of these, the receipt says so, and
//! `runtime.when_unconfinable = "refuse"` refuses the tool.

pub mod cgroup;
pub mod filter;
pub mod spawner;
mod sys;

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use self::cgroup::{Group, Limits, Root};
use crate::config::{Confinement as Mode, RuntimeConfig, WhenUnconfinable};
use crate::domain::amount::Amount;

/// What a process is started with: its command, its lease's resources and
/// network, and where it works.
pub struct Request<'a> {
    /// Program and arguments.
    pub argv: &'a [String],
    /// The lease's CPUs.
    pub cpu: Amount,
    /// The lease's memory, GB.
    pub memory_gb: Amount,
    /// Whether the lease allows internet egress.
    pub egress: bool,
    /// The attempt's directory ([`Confiner::workdir`]).
    pub workdir: &'a Path,
    /// Site endpoints offered inside its network, each already allowed by
    /// the site: the `(host, port)` it names, and where the appliance
    /// connects for it.
    pub endpoints: &'a [SiteEndpoint],
    /// Paths its release declares that the site allows it to read.
    pub read_paths: &'a [PathBuf],
}

pub use crate::domain::reach::{SiteEndpoint, TOOL_WORKDIR};

/// The `PATH` every tool process gets.
pub const TOOL_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Who tools run as, found once at start.
#[derive(Clone, Debug)]
enum Identity {
    /// The appliance is root: `runtime.tool_user`, or a uid per attempt
    /// from `runtime.tool_uid_range`.
    Root,
    /// The appliance's account has a subordinate range, and newuidmap
    /// mapped it: a uid of its own per attempt.
    Subordinate(Arc<Range>),
    /// Tools share the appliance's uid, and why.
    Shared(String),
}

/// The account's subordinate ids and the helpers that map them.
#[derive(Clone, Debug)]
struct Subordinate {
    uids: (u32, u32),
    gids: (u32, u32),
    newuidmap: PathBuf,
    newgidmap: PathBuf,
    account: String,
}

/// The user namespace every tool of an unprivileged appliance starts in,
/// mapped once at start with newuidmap: the appliance's own ids as its
/// root, and the whole subordinate range from 1 (slot `n` is uid and gid
/// `1 + n` there). A tool joins it (the appliance owns it, so its child
/// may), makes its other namespaces under it, and takes its slot's ids.
#[derive(Debug)]
struct Range {
    sub: Subordinate,
    /// `/proc/<pid>/ns/user` of the process that made it, open: the
    /// namespace lives as long as this does.
    userns: OwnedFd,
}

/// What this host can enforce, found once at start.
pub struct Confiner {
    cgroup: Result<Root, String>,
    network: Result<(), String>,
    /// A PID namespace and a mount namespace with a world built in it:
    /// the frame every tool's world starts from.
    world: Result<Frame, String>,
    /// What Landlock lets every tool read of the system: [`SYSTEM`] with
    /// `/etc` entry by entry, none at, above or below a protected path;
    /// opened once (each start adds them to its ruleset), with whether
    /// each is a file.
    system_read: Vec<(landlock::PathFd, bool)>,
    landlock: Result<u32, String>,
    filter: Result<(), String>,
    /// The process every tool is forked by ([`spawner`]).
    spawner: Result<spawner::Spawner, String>,
    identity: Identity,
    work_root: PathBuf,
    protected: Vec<PathBuf>,
    /// The uid slot each attempt with a working directory holds (an
    /// offset into the subordinate range or `runtime.tool_uid_range`).
    slots: Mutex<HashMap<String, u32>>,
    next_slot: AtomicU64,
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
    /// `own-root: ...` (the world built for it, in words), or why it sees
    /// the host's filesystem.
    #[serde(default)]
    pub filesystem: String,
    /// `landlock` (the working directory, the system's and the command's
    /// directories), or why not.
    pub files: String,
    /// The system-call filter and its version, or why none.
    #[serde(default)]
    pub syscalls: String,
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
    /// Set once the tool ended, when `pgid` is the first process of the
    /// tool's PID namespace, which stays after the tool until its group
    /// is removed.
    first: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// What the child needs until it has started: the Landlock ruleset and
    /// its working directory (to make it its own).
    held: Mutex<Vec<OwnedFd>>,
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
    /// Whether a tool gets a filesystem built for it, or why not.
    #[serde(default)]
    pub filesystem: String,
    /// Whether files are restricted (Landlock and its ABI), or why not.
    pub files: String,
    /// The system-call filter, or why none.
    #[serde(default)]
    pub syscalls: String,
    /// Who tools run as, or why they share the appliance's uid (what to
    /// install or configure).
    #[serde(default)]
    pub user: String,
    /// Whether tools run as an identity of their own (never the
    /// appliance's uid).
    #[serde(default)]
    pub own_identity: bool,
}

const GB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The system's directories a tool may read, at the same paths.
pub const SYSTEM: &[&str] = &[
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
];

/// Device files a tool may read and write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Where a tool's root is assembled, in its own mount namespace: an empty
/// directory of the work root, under which no source of any world lies
/// (the work root is protected; working directories are its other
/// entries).
const WORLD_BASE: &str = ".root";

impl Confiner {
    /// Finds what this host can enforce: a cgroup subtree (v2 if the
    /// host is v2-only and delegates the controllers, else v1), network
    /// and PID namespaces, a world of its own, Landlock, the system-call
    /// filter, and who tools run as. `work_root` holds the attempts'
    /// working directories (inside the data dir); `protected` is never
    /// readable by a tool. Groups go under `agentbay-tools/<instance>`,
    /// one subtree per appliance on the host (named after its data dir):
    /// what a killed run of this appliance left there is ended now.
    /// Tools start through the tool spawner ([`spawner::set_program`]).
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
        let mut c = Confiner {
            cgroup,
            network: Err("not probed".into()),
            world: Err("not probed".into()),
            landlock: Self::probe_landlock(),
            filter: filter::programs().map(|_| ()),
            spawner: Err("not started".into()),
            system_read: system_read(&protected),
            identity: Identity::Shared("not probed".into()),
            work_root,
            protected,
            slots: Mutex::new(HashMap::new()),
            next_slot: AtomicU64::new(0),
        };
        c.network = c
            .probe(sys::Namespaces::for_this_process(true, false))
            .map_err(|e| format!("a network namespace cannot be made here ({e}); needs root or unprivileged user namespaces"));
        c.world = c.probe_world();
        c.identity = c.probe_identity();
        // The spawner starts once the tools' user namespace (if any) is
        // mapped: it lives in it.
        c.spawner = match &c.identity {
            Identity::Subordinate(range) => range
                .userns
                .try_clone()
                .map_err(|e| format!("the tools' user namespace: {e}"))
                .and_then(|userns| spawner::Spawner::start(Some(userns), c.cgroup.clone().ok())),
            _ => spawner::Spawner::start(None, c.cgroup.clone().ok()),
        };
        if let Ok(root) = &c.cgroup {
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
        c.remove_workdirs();
        let host = c.host(&RuntimeConfig::default());
        tracing::info!(
            mechanism = %host.mechanism,
            cgroup_unavailable = host.cgroup_unavailable.as_deref().unwrap_or("-"),
            network = %host.network,
            processes = %host.processes,
            filesystem = %host.filesystem,
            files = %host.files,
            syscalls = %host.syscalls,
            user = %host.user,
            "tool confinement"
        );
        c
    }

    /// Whether `/bin/true` starts under `namespaces` (and what else the
    /// steps say) here.
    fn probe_steps(steps: sys::Steps) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
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

    fn probe(&self, namespaces: sys::Namespaces) -> Result<(), String> {
        Self::probe_steps(sys::Steps {
            namespaces: Some(namespaces),
            ..sys::Steps::default()
        })
    }

    /// The frame of every tool's world, where one can be built here: a
    /// PID and mount namespace with the system's directories, a `/proc`
    /// and a `/tmp` of its own.
    fn probe_world(&self) -> Result<Frame, String> {
        let frame = Frame::system(self.work_root.join(WORLD_BASE), &self.protected)
            .map_err(|e| format!("a filesystem of its own cannot be made here: {e}"))?;
        let dir = self.work_root.join(".probe");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("no directory to test in: {e}"))?;
        let mut ns = sys::Namespaces::for_this_process(false, true);
        ns.world = Some(
            frame
                .clone()
                .finish(1, Vec::new(), &dir, &dir.join("release"), None),
        );
        let probed = self.probe(ns).map_err(|e| {
            format!("a PID and mount namespace with a filesystem of its own cannot be made here ({e}); needs root or unprivileged user namespaces")
        });
        let _ = std::fs::remove_dir_all(&dir);
        probed.map(|()| frame)
    }

    /// Who tools run as here: root chooses per call; an unprivileged
    /// account needs a subordinate range and newuidmap that maps it.
    fn probe_identity(&self) -> Identity {
        if sys::is_root() {
            return Identity::Root;
        }
        if let Err(why) = &self.world {
            // A subordinate uid needs a working directory it is given in
            // a world of its own.
            return Identity::Shared(why.clone());
        }
        let sub = match subordinate() {
            Ok(sub) => sub,
            Err(why) => return Identity::Shared(why),
        };
        match Self::map_range(&sub) {
            Ok(userns) => Identity::Subordinate(Arc::new(Range { sub, userns })),
            Err(e) => Identity::Shared(format!(
                "{} cannot map the subordinate range of {} here ({e}): is it set-uid root (package uidmap), and may the service gain privileges (NoNewPrivileges=false)?",
                sub.newuidmap.display(),
                sub.account
            )),
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

    /// Who tools run as under `config`, in words, and whether that is an
    /// identity of their own.
    fn who(&self, config: &RuntimeConfig) -> (String, bool) {
        match &self.identity {
            Identity::Root => match (&config.tool_uid_range, config.tool_user.as_str()) {
                (Some(range), _) => (
                    format!(
                        "a uid of its own per attempt from runtime.tool_uid_range {range}"
                    ),
                    true,
                ),
                (None, "" | "root") => (
                    "shares the appliance's uid: root (runtime.tool_user is empty; set it, or runtime.tool_uid_range)".to_string(),
                    false,
                ),
                (None, user) => (format!("{user} (runtime.tool_user)"), true),
            },
            Identity::Subordinate(range) => (
                format!(
                    "a uid of its own per attempt from the subordinate range {}-{} of {} (newuidmap)",
                    range.sub.uids.0,
                    range.sub.uids.0 + range.sub.uids.1 - 1,
                    range.sub.account
                ),
                true,
            ),
            Identity::Shared(why) => (format!("shares the appliance's uid: {why}"), false),
        }
    }

    /// Whether tools would run as the appliance's own uid under `config`
    /// (what a peer-credential check, such as PostgreSQL's `peer`, cannot
    /// tell apart), and why.
    pub fn tools_share_uid(&self, config: &RuntimeConfig) -> Option<String> {
        let (who, own) = self.who(config);
        (!own).then_some(who)
    }

    /// What this host enforces under `config`.
    pub fn host(&self, config: &RuntimeConfig) -> HostReport {
        let mechanism = match self.cgroup_for(config) {
            Ok(Some(root)) => root.mechanism(),
            Ok(None) => "rlimit",
            Err(_) => "refused",
        };
        let (user, own_identity) = self.who(config);
        HostReport {
            mechanism: mechanism.into(),
            cgroup_unavailable: self.cgroup.as_ref().err().cloned(),
            network: match &self.network {
                Ok(()) => "a network namespace with only loopback for tools without egress".into(),
                Err(e) => format!("not isolated: {e}"),
            },
            processes: match (&self.spawner, &self.world) {
                (Err(e), _) => format!("no tool can start: {e}"),
                (Ok(_), Ok(_)) => "a PID namespace and /proc of its own for every tool".into(),
                (Ok(_), Err(e)) => format!("not isolated: {e}"),
            },
            filesystem: match &self.world {
                Ok(_) => "a root of its own for every tool: the system's directories read-only, its program, release and allowed paths, its working directory and /tmp".into(),
                Err(e) => format!("the host's: {e}"),
            },
            files: match &self.landlock {
                Ok(abi) => format!("Landlock (ABI {abi})"),
                Err(e) => format!("not restricted: {e}"),
            },
            syscalls: match &self.filter {
                Ok(_) => format!("seccomp filter {}", filter::NAME),
                Err(e) => format!("not filtered: {e}"),
            },
            user,
            own_identity,
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

    /// The directory of an attempt's tools (made if missing): `home/`, the
    /// working directory its tools write in (and see at
    /// [`TOOL_WORKDIR`]), and `release/`, where the release's own files
    /// go (read-only to its tools, at `release/` in their working
    /// directory). Where the host allows it (the appliance runs as root),
    /// `home/` is a tmpfs of at most `runtime.tool_workdir_mb`, its pages
    /// charged to the tools that write them.
    pub fn workdir(&self, attempt: &str, config: &RuntimeConfig) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let d = self.work_root.join(attempt);
        if !d.exists() {
            let home = d.join("home");
            std::fs::create_dir_all(&home)?;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))?;
            if sys::is_root() {
                sys::mount_tmpfs(&home, config.tool_workdir_mb)?;
            }
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
            if self.world.is_ok() {
                // Where the release's files are mounted in its world.
                std::fs::create_dir(home.join("release"))?;
                std::fs::set_permissions(
                    home.join("release"),
                    std::fs::Permissions::from_mode(0o755),
                )?;
            } else {
                std::os::unix::fs::symlink("../release", home.join("release"))?;
            }
            if let Ok(Some((uid, gid))) = self.tool_ids(attempt, config) {
                sys::chown(&home, uid, gid)?;
            }
        }
        Ok(d)
    }

    /// The uid slot of `attempt`, taken if it has none.
    /// The uid slot of `attempt` in a range of `span` uids, taken if it
    /// has none: the next one no live attempt holds, or `None` when live
    /// attempts hold them all.
    fn slot(&self, attempt: &str, span: u32) -> Option<u32> {
        let mut slots = self.slots.lock();
        if let Some(s) = slots.get(attempt) {
            return Some(*s);
        }
        if slots.len() >= span as usize {
            return None;
        }
        loop {
            let s = (self.next_slot.fetch_add(1, Ordering::Relaxed) % u64::from(span)) as u32;
            if !slots.values().any(|v| *v == s) {
                slots.insert(attempt.to_string(), s);
                return Some(s);
            }
        }
    }

    /// The host uid and gid a root appliance's tools of `attempt` run
    /// as: `runtime.tool_uid_range` (one each per attempt), else
    /// `runtime.tool_user` (empty: root, as the appliance). `None` where
    /// the appliance is not root. A name that is no account, or a range
    /// with no uid left, is refused in words.
    fn tool_ids(
        &self,
        attempt: &str,
        config: &RuntimeConfig,
    ) -> Result<Option<(libc::uid_t, libc::gid_t)>, String> {
        if !matches!(self.identity, Identity::Root) {
            return Ok(None);
        }
        if let Some(range) = &config.tool_uid_range {
            let slot = self.slot(attempt, range.count).ok_or_else(|| {
                format!("runtime.tool_uid_range {range} has no uid left for another attempt")
            })?;
            let id = range.first + slot;
            return Ok(Some((id, id)));
        }
        if config.tool_user.is_empty() {
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
    fn workdir_limit(home: &Path) -> String {
        match sys::tmpfs_size(home) {
            Some(bytes) => format!("a tmpfs of at most {} MiB", bytes >> 20),
            None => "not size-limited (a tmpfs needs the appliance to run as root)".to_string(),
        }
    }

    /// Removes an attempt's directory. What its tools made under a
    /// subordinate uid is not the appliance's to delete: then a process
    /// mapped as that range's owner removes it.
    pub fn remove_workdir(&self, attempt: &str) {
        let d = self.work_root.join(attempt);
        sys::unmount(&d.join("home"));
        if std::fs::remove_dir_all(&d).is_err()
            && d.exists()
            && let Identity::Subordinate(range) = &self.identity
        {
            Self::remove_as_range(range, &d);
        }
        self.slots.lock().remove(attempt);
    }

    /// `rm -rf dir` as root of the tools' user namespace, which maps the
    /// appliance's own ids and the whole subordinate range.
    fn remove_as_range(range: &Range, dir: &Path) {
        use std::os::unix::process::CommandExt;
        let steps = sys::Steps::in_user_namespace(sys::UserMaps::Join(range.userns.as_raw_fd()));
        let mut cmd = std::process::Command::new("/bin/rm");
        cmd.arg("-rf")
            .arg("--")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: Steps::apply makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || steps.apply());
        }
        let status = cmd.status();
        if !matches!(status, Ok(s) if s.success()) || dir.exists() {
            tracing::warn!(dir = %dir.display(), "a tool's working directory could not be removed");
        }
    }

    /// Removes every working directory (at start: what a killed run left).
    fn remove_workdirs(&self) {
        if let Ok(entries) = std::fs::read_dir(&self.work_root) {
            for e in entries.flatten() {
                if let Some(name) = e.file_name().to_str()
                    && name != WORLD_BASE
                {
                    self.remove_workdir(name);
                }
            }
        }
    }

    /// The tools' user namespace ([`Range`]): a process made in a new user
    /// namespace waits on a pipe while newuidmap and newgidmap map it, then
    /// on its standard input while the appliance opens its namespace, and
    /// ends.
    fn map_range(sub: &Subordinate) -> Result<OwnedFd, String> {
        use std::io::{Read, Write};
        use std::os::unix::process::CommandExt;
        let (uid, gid) = sys::ids();
        let lines = |own: u32, (first, count): (u32, u32)| -> Vec<String> {
            [0, own, 1, 1, first, count].map(|n| n.to_string()).to_vec()
        };
        let (ready_r, ready_w) = sys::pipe().map_err(|e| format!("no pipe: {e}"))?;
        let (go_r, go_w) = sys::pipe().map_err(|e| format!("no pipe: {e}"))?;
        let steps = sys::Steps::in_user_namespace(sys::UserMaps::Mapped {
            ready: ready_w.as_raw_fd(),
            go: go_r.as_raw_fd(),
        });
        let mut cmd = std::process::Command::new("/bin/cat");
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: Steps::apply makes only async-signal-safe calls.
        unsafe {
            cmd.pre_exec(move || steps.apply());
        }
        // The child waits before it execs until its maps are written, and
        // spawning waits for the exec: they are written on another thread.
        let (child, mapped) = std::thread::scope(|scope| {
            let mapping = scope.spawn(|| -> Result<(), String> {
                let mut ready = std::fs::File::from(ready_r);
                let mut go = std::fs::File::from(go_w);
                let mut pid = [0u8; 4];
                ready
                    .read_exact(&mut pid)
                    .map_err(|e| format!("the process to map did not start: {e}"))?;
                let pid = i32::from_ne_bytes(pid).to_string();
                let map = |tool: &Path, lines: &[String]| -> Result<(), String> {
                    let out = std::process::Command::new(tool)
                        .arg(&pid)
                        .args(lines)
                        .stdin(std::process::Stdio::null())
                        .output()
                        .map_err(|e| format!("{}: {e}", tool.display()))?;
                    if out.status.success() {
                        return Ok(());
                    }
                    Err(format!(
                        "{} {}: {}",
                        tool.display(),
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ))
                };
                let mapped = map(&sub.newuidmap, &lines(uid, sub.uids))
                    .and_then(|()| map(&sub.newgidmap, &lines(gid, sub.gids)));
                let _ = go.write_all(&[u8::from(mapped.is_err())]);
                mapped
            });
            let child = cmd.spawn();
            // The appliance's copies: the mapping thread sees the end of
            // the pipe if the child never started.
            drop((ready_w, go_r));
            let mapped = mapping
                .join()
                .unwrap_or_else(|_| Err("the mapping thread failed".into()));
            (child, mapped)
        });
        let mut child = child.map_err(|e| e.to_string())?;
        let opened = mapped.and_then(|()| {
            std::fs::File::open(format!("/proc/{}/ns/user", child.id()))
                .map(OwnedFd::from)
                .map_err(|e| format!("the mapped namespace cannot be opened: {e}"))
        });
        drop(child.stdin.take());
        let _ = child.wait();
        opened
    }

    /// Starts `req`'s process, confined, through the tool spawner: the
    /// process, once it has exec'd, and its cage. Refused, with the
    /// reason, where the host cannot enforce what `config` requires.
    pub async fn start(
        &self,
        req: &Request<'_>,
        config: &RuntimeConfig,
    ) -> Result<(spawner::Tool, Cage), String> {
        let spawner = self.spawner.as_ref().map_err(Clone::clone)?;
        cgroup::starting();
        let (mut order, cage) = self.prepare(req, config)?;
        let fds: Vec<_> = order
            .steps
            .descriptors()
            .into_iter()
            .map(|fd| *fd)
            .collect();
        let mut tool = spawner.spawn(&order, &fds).await?;
        let mut cage = cage;
        cage.first = tool.first.then(|| tool.over.clone());
        if let Some(group) = tool.group.take() {
            cage.report.get_mut().group = Some(group.path().display().to_string());
            cage.group = Some(group);
        }
        cage.started(tool.pid)?;
        Ok((tool, cage))
    }

    /// The order that starts `req`'s process and its cage (which holds
    /// the descriptors the order names until the process starts).
    fn prepare(
        &self,
        req: &Request<'_>,
        config: &RuntimeConfig,
    ) -> Result<(spawner::Order, Cage), String> {
        let Some(program) = req.argv.first() else {
            return Err("the tool declares no command".into());
        };
        let refuse = config.when_unconfinable == WhenUnconfinable::Refuse;
        let attempt = req
            .workdir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let home = req.workdir.join("home");
        let release = req.workdir.join("release");
        let memory_bytes = (req.memory_gb.as_f64() * GB) as u64;
        let pids = config.tool_pids_max;
        let limits = Limits::of(req.cpu.thousandths(), memory_bytes, pids);
        let mut steps = sys::Steps::default();
        let mut held: Vec<OwnedFd> = Vec::new();
        let (user, own_identity) = self.who(config);
        if !own_identity && refuse {
            return Err(format!(
                "a tool would run as the appliance's own uid and runtime.when_unconfinable is refuse: {user}"
            ));
        }
        // The tool spawner makes the group and writes its limits; the
        // process joins it.
        let mechanism = match self.cgroup_for(config)? {
            Some(root) => {
                steps.cgroup = Some(root.spec(limits));
                root.mechanism()
            }
            None => {
                steps.address_space = Some(memory_bytes);
                steps.processes = Some(u64::from(pids));
                "rlimit"
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
        let user = match &self.identity {
            Identity::Subordinate(range) => {
                let sub = &range.sub;
                let slot = self
                    .slot(&attempt, sub.uids.1.min(sub.gids.1))
                    .ok_or_else(|| {
                        format!(
                            "the subordinate range of {} has no uid left for another attempt",
                            sub.account
                        )
                    })?;
                // The spawner lives in the tools' user namespace: the tool
                // makes its other namespaces there and takes its slot's ids.
                namespaces.user_maps = None;
                namespaces.become_ids = Some((1 + slot, 1 + slot));
                format!(
                    "uid {} of the subordinate range of {}, its own while the attempt runs",
                    sub.uids.0 + slot,
                    sub.account
                )
            }
            Identity::Root => {
                steps.user = self.tool_ids(&attempt, config)?;
                match (steps.user, &config.tool_uid_range) {
                    (Some((uid, _)), Some(_)) => format!(
                        "uid {uid} of runtime.tool_uid_range, its own while the attempt runs"
                    ),
                    _ => user,
                }
            }
            Identity::Shared(_) => user,
        };
        // Its program's and interpreter's directories and what its
        // release declares that the site allows, judged on what they
        // resolve to.
        let reads: Vec<(PathBuf, PathBuf)> = program_dirs(program, &home)
            .iter()
            .chain(req.read_paths)
            .filter_map(|p| {
                let real = std::fs::canonicalize(p).ok()?;
                crate::domain::reach::protected_conflict(&real, &self.protected)
                    .is_none()
                    .then(|| (p.clone(), real))
            })
            .collect();
        let (processes, filesystem) = match &self.world {
            Ok(frame) => {
                // The first tool of an attempt makes its working directory
                // its own (its subordinate uid); after that the appliance
                // can no longer open it, and need not.
                let owner = match namespaces.become_ids {
                    Some((id, _)) if owned_by_appliance(&home) => Some((
                        sys::open_dir(&home)
                            .map_err(|e| format!("the tool's working directory: {e}"))?,
                        id,
                    )),
                    _ => None,
                };
                namespaces.pid = true;
                namespaces.world = Some(frame.clone().finish(
                    config.tool_workdir_mb,
                    reads.clone(),
                    &home,
                    &release,
                    owner.as_ref().map(|(fd, id)| (fd.as_raw_fd(), *id)),
                ));
                held.extend(owner.map(|(fd, _)| fd));
                (
                    "own-namespace".to_string(),
                    format!(
                        "own-root: the system's directories read-only, {}; its working directory {TOOL_WORKDIR} ({}) and /tmp",
                        "its program, release and allowed paths",
                        Self::workdir_limit(&home)
                    ),
                )
            }
            Err(why) if refuse => {
                return Err(format!(
                    "this host cannot give a tool a filesystem and processes of its own and runtime.when_unconfinable is refuse: {why}"
                ));
            }
            Err(why) => (
                format!("the host's (not isolated: {why})"),
                format!("the host's: {why}"),
            ),
        };
        let mut listeners = None;
        if namespaces.network && !req.endpoints.is_empty() {
            let (ours, theirs) = sys::socket_pair(libc::SOCK_DGRAM)
                .map_err(|e| format!("no socket for site endpoints: {e}"))?;
            namespaces.listen = req.endpoints.iter().map(|(_, port, _)| *port).collect();
            namespaces.listeners_to = Some(theirs.as_raw_fd());
            listeners = Some((ours, theirs, req.endpoints.to_vec()));
        }
        let world = namespaces.world.is_some();
        if namespaces.network || namespaces.pid || namespaces.become_ids.is_some() {
            steps.namespaces = Some(namespaces);
        }
        let files = match &self.landlock {
            Ok(abi) => {
                let mut read: Vec<PathBuf> = reads.into_iter().map(|(_, real)| real).collect();
                read.sort();
                read.dedup();
                let granted = granted(&read);
                steps.landlock = Some(if world {
                    // Its world holds only what it may read: the process
                    // makes its ruleset of the world's own paths.
                    use landlock::Access;
                    sys::Landlock::World {
                        handled: landlock::AccessFs::from_all(landlock_abi(*abi)).bits(),
                        writable: [TOOL_WORKDIR, "/tmp"]
                            .iter()
                            .map(|p| c_path(Path::new(p)))
                            .collect(),
                        devices: DEVICES.iter().map(|p| c_path(Path::new(p))).collect(),
                    }
                } else {
                    let fd = self.ruleset(read, &home, &release)?;
                    let landlock = sys::Landlock::Ruleset(fd.as_raw_fd());
                    held.push(fd);
                    landlock
                });
                format!(
                    "landlock: read {granted}; write the working directory, {}",
                    Self::workdir_limit(&home)
                )
            }
            Err(why) if refuse => {
                return Err(format!(
                    "this host cannot restrict a tool's files and runtime.when_unconfinable is refuse: {why}"
                ));
            }
            Err(why) => format!(
                "not restricted: {why}; the working directory is {}",
                Self::workdir_limit(&home)
            ),
        };
        let syscalls = match &self.filter {
            Ok(()) => {
                steps.filter = true;
                format!(
                    "seccomp filter {}: no sockets but IP and socketpair, no ptrace, keyctl, bpf, mounts or new namespaces",
                    filter::NAME
                )
            }
            Err(why) if refuse => {
                return Err(format!(
                    "this host cannot filter a tool's system calls and runtime.when_unconfinable is refuse: {why}"
                ));
            }
            Err(why) => format!("not filtered: {why}"),
        };
        // The working directory and temporary files as the tool sees them.
        let (cwd, tmp): (&Path, &Path) = if world {
            (Path::new(TOOL_WORKDIR), Path::new("/tmp"))
        } else {
            (&home, &home)
        };
        let c = |s: &[u8]| CString::new(s).map_err(|_| "a NUL in the tool's command".to_string());
        // A name without a slash is looked for on the tool's PATH (in its
        // world, once built).
        let program_paths = if program.contains('/') {
            vec![c(program.as_bytes())?]
        } else {
            TOOL_PATH
                .split(':')
                .map(|d| c(format!("{d}/{program}").as_bytes()))
                .collect::<Result<_, _>>()?
        };
        let env = [
            ("PATH", TOOL_PATH.as_ref()),
            ("LANG", std::ffi::OsStr::new("C.UTF-8")),
            ("HOME", cwd.as_os_str()),
            ("TMPDIR", tmp.as_os_str()),
        ];
        // With a world, the child changes into its working directory
        // once it is built (a subordinate uid's directory is not the
        // appliance's to enter, and a process made ahead no longer sees
        // the host's): until then it is at `/`.
        let start_in = if world { Path::new("/") } else { &home };
        let order = spawner::Order {
            program: program_paths,
            argv: req
                .argv
                .iter()
                .map(|a| c(a.as_bytes()))
                .collect::<Result<_, _>>()?,
            env: env
                .iter()
                .map(|(k, v)| c(&[k.as_bytes(), b"=", v.as_encoded_bytes()].concat()))
                .collect::<Result<_, _>>()?,
            cwd: c(start_in.as_os_str().as_encoded_bytes())?,
            steps,
        };
        let report = Confinement {
            mechanism: mechanism.to_string(),
            group: None,
            cpu: req.cpu,
            memory_bytes,
            pids,
            network,
            processes,
            filesystem,
            files,
            syscalls,
            user,
            peak_memory_bytes: None,
            cpu_seconds: None,
            killed_by: None,
        };
        metrics::counter!(crate::telemetry::names::TOOL_PROCESSES, "mechanism" => mechanism)
            .increment(1);
        Ok((
            order,
            Cage {
                group: None,
                report: Mutex::new(report),
                pgid: AtomicI32::new(0),
                first: None,
                held: Mutex::new(held),
                forwards: Mutex::new(Vec::new()),
                listeners: Mutex::new(listeners),
            },
        ))
    }

    /// The Landlock ruleset of a tool without a world of its own: read
    /// the system's directories, `read` (the directories of its program
    /// and of the program's interpreter and the read paths the site
    /// allowed, resolved and judged against the protected paths) and its
    /// release's files; read and write its working directory and the
    /// usual device files. Landlock grants what a path resolves to when
    /// the rule is added, so a symbolic link in an allowed directory that
    /// points at a protected one grants nothing.
    fn ruleset(
        &self,
        mut read: Vec<PathBuf>,
        home: &Path,
        release: &Path,
    ) -> Result<OwnedFd, String> {
        use landlock::{
            ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, path_beneath_rules,
        };
        let abi = ABI::V5;
        if release.is_dir() {
            read.push(release.to_path_buf());
        }
        let err = |e: landlock::RulesetError| format!("no Landlock ruleset: {e}");
        let ruleset = Ruleset::default()
            .handle_access(AccessFs::from_all(abi))
            .map_err(err)?
            .create()
            .map_err(err)?
            .add_rules(self.system_read.iter().map(|(fd, is_file)| {
                let mut access = AccessFs::from_read(abi);
                if *is_file {
                    access &= AccessFs::from_file(abi);
                }
                Ok::<_, landlock::RulesetError>(landlock::PathBeneath::new(fd, access))
            }))
            .map_err(err)?
            .add_rules(path_beneath_rules(&read, AccessFs::from_read(abi)))
            .map_err(err)?
            .add_rules(path_beneath_rules(
                DEVICES
                    .iter()
                    .chain(std::iter::once(&home.to_str().unwrap_or("/nonexistent"))),
                AccessFs::from_all(abi),
            ))
            .map_err(err)?;
        let fd: Option<OwnedFd> = ruleset.into();
        Ok(fd.ok_or("Landlock is not enforced by this kernel")?)
    }
}

/// The part of a tool's world that is the same for every tool, found once
/// at start: its root's base, the system's directories at their paths (a
/// merged `/usr`'s `/lib` and `/bin` as the same links, a protected path
/// below one masked), a `/dev` of six devices and a `/proc`. Each tool's
/// world is a copy with its own paths added ([`Frame::finish`]).
#[derive(Clone)]
struct Frame {
    base: PathBuf,
    places: Vec<sys::Place>,
    /// Directories made in the root so far, as the tool sees them.
    made: Vec<PathBuf>,
    /// What is bound so far, as the tool sees it: what lies below shows.
    bound: Vec<PathBuf>,
}

/// What a tool may read, in words: the directories of its program and
/// what the site allowed by name (`read`, resolved), the system's as one
/// phrase.
fn granted(read: &[PathBuf]) -> String {
    let named: Vec<String> = read
        .iter()
        .filter(|r| {
            r.exists()
                && !r.starts_with("/etc")
                && !SYSTEM.iter().any(|s| Path::new(s) == r.as_path())
        })
        .map(|r| r.display().to_string())
        .collect();
    if named.is_empty() {
        "the system's directories and its release".to_string()
    } else {
        format!(
            "the system's directories, its release and {}",
            named.join(", ")
        )
    }
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a path")
}

impl Frame {
    /// The frame at `base` (made if missing), with `protected` masked
    /// wherever a system directory holds it.
    fn system(base: PathBuf, protected: &[PathBuf]) -> std::io::Result<Frame> {
        use sys::Place;
        std::fs::create_dir_all(&base)?;
        let mut f = Frame {
            base,
            places: Vec::new(),
            made: vec![PathBuf::from("/")],
            bound: Vec::new(),
        };
        for s in SYSTEM {
            let p = Path::new(s);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    let to = std::fs::read_link(p)?;
                    f.places.push(Place::Link {
                        to: c_path(&to),
                        at: f.inside(p),
                    });
                }
                Ok(m) if m.is_dir() => {
                    f.bind(p, p, false, false);
                    // The outermost protected paths only: a mask hides
                    // what lies below it, and leaves no place to mount on.
                    let outermost = protected.iter().filter(|q| {
                        q.starts_with(p) && !protected.iter().any(|o| o != *q && q.starts_with(o))
                    });
                    for q in outermost {
                        match std::fs::metadata(q) {
                            Ok(m) if m.is_dir() => f.places.push(Place::Tmpfs {
                                at: f.inside(q),
                                options: c"size=4k,mode=0555".into(),
                                read_only: true,
                            }),
                            Ok(_) => f.places.push(Place::Bind {
                                from: c"/dev/null".into(),
                                at: f.inside(q),
                                write: false,
                                dev: false,
                            }),
                            Err(_) => {}
                        }
                    }
                }
                _ => {}
            }
        }
        for d in DEVICES.iter().map(Path::new).filter(|d| d.exists()) {
            f.dirs_to(Path::new("/dev"));
            f.places.push(Place::File(f.inside(d)));
            f.places.push(Place::Bind {
                from: c_path(d),
                at: f.inside(d),
                write: true,
                dev: true,
            });
        }
        for (name, to) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            f.dirs_to(Path::new("/dev"));
            f.places.push(Place::Link {
                to: c_path(Path::new(to)),
                at: f.inside(&Path::new("/dev").join(name)),
            });
        }
        f.dirs_to(Path::new("/proc"));
        f.places.push(Place::Proc(f.inside(Path::new("/proc"))));
        Ok(f)
    }

    /// Where the tool's path `p` is while its root is assembled.
    fn inside(&self, p: &Path) -> CString {
        c_path(&self.base.join(p.strip_prefix("/").unwrap_or(p)))
    }

    /// Makes the directories on the way to `p`, and `p`, each once.
    fn dirs_to(&mut self, p: &Path) {
        let mut at = PathBuf::from("/");
        for part in p.components().skip(1) {
            at.push(part);
            if !self.made.contains(&at) {
                self.places.push(sys::Place::Dir(self.inside(&at)));
                self.made.push(at.clone());
            }
        }
    }

    /// Binds the host's `from` at the tool's `at` (a directory, or a file
    /// when `from` is one).
    fn bind(&mut self, from: &Path, at: &Path, write: bool, dev: bool) {
        if from.is_dir() {
            self.dirs_to(at);
        } else {
            if let Some(parent) = at.parent() {
                self.dirs_to(parent);
            }
            self.places.push(sys::Place::File(self.inside(at)));
        }
        self.places.push(sys::Place::Bind {
            from: c_path(from),
            at: self.inside(at),
            write,
            dev,
        });
        self.bound.push(at.to_path_buf());
    }

    /// A tool's world: this frame with a `/tmp` of `tmp_mb` MiB, `extra`
    /// read-only (each `(path, what it resolves to)`, judged already by
    /// the protected-path rule; skipped where a bound directory shows it
    /// or where the working directory goes), `home` read-write at
    /// [`TOOL_WORKDIR`] with `release` read-only in it, and `owner` (its
    /// working directory, open) given to the tool's uid and gid there. A source is bound by
    /// the path judged here, which the child resolves in its own copy of
    /// the host's mounts (a descriptor of the appliance's namespace cannot
    /// be bound in another).
    fn finish(
        mut self,
        tmp_mb: u64,
        mut extra: Vec<(PathBuf, PathBuf)>,
        home: &Path,
        release: &Path,
        owner: Option<(std::os::fd::RawFd, libc::uid_t)>,
    ) -> sys::World {
        // What the frame holds so far every tool's world has.
        let shared = self.places.len();
        self.dirs_to(Path::new("/tmp"));
        self.places.push(sys::Place::Tmpfs {
            at: self.inside(Path::new("/tmp")),
            options: c_path(Path::new(&format!("size={tmp_mb}m,mode=1777"))),
            read_only: false,
        });
        extra.sort_by_key(|(p, _)| p.components().count());
        for (p, real) in extra {
            if !self.bound.iter().any(|b| p.starts_with(b)) && !p.starts_with(TOOL_WORKDIR) {
                self.bind(&real, &p, false, false);
            }
        }
        let workdir = Path::new(TOOL_WORKDIR);
        self.bind(home, workdir, true, false);
        // `home/release`, where it is mounted, was made with `home` (which
        // the appliance may no longer enter to look).
        if release.is_dir() {
            self.places.push(sys::Place::Bind {
                from: c_path(release),
                at: self.inside(&workdir.join("release")),
                write: false,
                dev: false,
            });
        }
        if let Some((fd, id)) = owner {
            self.places.push(sys::Place::Own {
                fd,
                uid: id,
                gid: id,
            });
        }
        sys::World {
            base: c_path(&self.base),
            options: c"size=1m,nr_inodes=4096,mode=0755".into(),
            places: self.places,
            shared,
            cwd: c_path(workdir),
            pivoted: false,
        }
    }
}

/// What Landlock lets every tool read of the system ([`SYSTEM`], `/etc`
/// entry by entry), none at, above or below a `protected` path, opened,
/// with whether each is a file.
fn system_read(protected: &[PathBuf]) -> Vec<(landlock::PathFd, bool)> {
    let mut read: Vec<PathBuf> = SYSTEM
        .iter()
        .filter(|s| **s != "/etc")
        .map(PathBuf::from)
        .collect();
    if let Ok(entries) = std::fs::read_dir("/etc") {
        read.extend(entries.flatten().map(|e| e.path()));
    }
    read.retain(|r| crate::domain::reach::protected_conflict(r, protected).is_none());
    read.into_iter()
        .filter_map(|p| {
            let is_file = !std::fs::metadata(&p).ok()?.is_dir();
            Some((landlock::PathFd::new(&p).ok()?, is_file))
        })
        .collect()
}

/// Whether `path` belongs to the appliance's own uid.
fn owned_by_appliance(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == sys::ids().0)
}

/// The Landlock ABI the rulesets above handle, as far as the kernel has
/// it (what a rule added by the child may grant).
fn landlock_abi(kernel: u32) -> landlock::ABI {
    match kernel {
        0 | 1 => landlock::ABI::V1,
        2 => landlock::ABI::V2,
        3 => landlock::ABI::V3,
        4 => landlock::ABI::V4,
        _ => landlock::ABI::V5,
    }
}

/// The subordinate uid and gid ranges of the appliance's account
/// (`/etc/subuid`, `/etc/subgid`) and the helpers that map them, or what
/// is missing, in words that say what to do.
fn subordinate() -> Result<Subordinate, String> {
    let (uid, _) = sys::ids();
    let account = sys::account_name(uid).unwrap_or_else(|| uid.to_string());
    let find = |file: &str| -> Option<(u32, u32)> {
        let text = std::fs::read_to_string(file).ok()?;
        text.lines()
            .filter_map(|l| {
                let mut f = l.trim().split(':');
                let (who, first, count) = (f.next()?, f.next()?, f.next()?);
                (who == account || who == uid.to_string())
                    .then(|| Some((first.parse().ok()?, count.parse().ok()?)))
                    .flatten()
            })
            .filter(|(_, count): &(u32, u32)| *count > 0)
            .max_by_key(|(_, count)| *count)
    };
    let helper = |name: &str| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    };
    let (Some(newuidmap), Some(newgidmap)) = (helper("newuidmap"), helper("newgidmap")) else {
        return Err(
            "newuidmap and newgidmap are not installed (Debian and Ubuntu: apt-get install uidmap)"
                .to_string(),
        );
    };
    let uids = find("/etc/subuid").ok_or_else(|| {
        format!("the account {account} has no subordinate uid range in /etc/subuid (usermod --add-subuids FIRST-LAST {account})")
    })?;
    let gids = find("/etc/subgid").ok_or_else(|| {
        format!("the account {account} has no subordinate gid range in /etc/subgid (usermod --add-subgids FIRST-LAST {account})")
    })?;
    Ok(Subordinate {
        uids,
        gids,
        newuidmap,
        newgidmap,
        account,
    })
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
    fn started(&self, pid: u32) -> Result<(), String> {
        self.pgid.store(pid as i32, Ordering::Relaxed);
        self.held.lock().clear();
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

/// Counts a kill of the group's that nobody said (for its memory or its
/// processes).
fn count_kill(group: &Group) {
    let used = group.used();
    let reason = if used.oom_kills > 0 {
        "oom"
    } else if used.pids_refused > 0 {
        "pids"
    } else {
        return;
    };
    metrics::counter!(crate::telemetry::names::TOOL_KILLS, "reason" => reason).increment(1);
}

impl Drop for Cage {
    fn drop(&mut self) {
        for f in self.forwards.lock().drain(..) {
            f.abort();
        }
        let ended = self
            .first
            .as_ref()
            .is_some_and(|over| over.load(Ordering::Acquire));
        let unsaid = self.report.lock().killed_by.is_none();
        match self.group.take() {
            // Whether the group killed the tree for its memory or its
            // processes, when nobody said why, is read and counted before
            // the group goes, apart: not while other tools start.
            Some(g) => g.remove_later(ended, unsaid.then_some(count_kill as fn(&Group))),
            // Only the first process of its namespace is left, which the
            // spawner lets go at a quiet moment.
            None if ended => {}
            None => sys::kill_group(self.pgid.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protected directory under a system directory is masked once, and
    /// what lies below it is not masked again (there would be nothing to
    /// mount on): the packaged configuration directory and its files.
    #[test]
    fn a_protected_tree_below_a_system_directory_is_masked_once() {
        let dir = std::fs::read_dir("/etc")
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.is_dir()
                    && std::fs::read_dir(p)
                        .map(|mut d| d.any(|e| e.is_ok_and(|e| e.path().is_file())))
                        .unwrap_or(false)
            })
            .expect("a directory with a file in /etc");
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.is_file())
            .unwrap();
        let base = tempfile::tempdir().unwrap();
        let frame = Frame::system(base.path().join("root"), &[dir.clone(), file.clone()]).unwrap();
        let masks: Vec<String> = frame
            .places
            .iter()
            .filter_map(|p| match p {
                sys::Place::Tmpfs {
                    at,
                    read_only: true,
                    ..
                } => Some(at.to_string_lossy().into_owned()),
                sys::Place::Bind {
                    from,
                    at,
                    write: false,
                    ..
                } if from.as_c_str() == c"/dev/null" => Some(at.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let inside = |p: &Path| frame.inside(p).to_string_lossy().into_owned();
        assert_eq!(masks, vec![inside(&dir)], "{}", file.display());
    }
}
