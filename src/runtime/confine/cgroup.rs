//! The cgroup file protocol, both versions, under a subtree the appliance
//! owns: create a group with limits, read what it used, kill every process
//! in it, remove it.
//!
//! Written against the kernel's files rather than a crate: cgroups-rs 0.3
//! creates groups relative to the hierarchy's root (and on v2 enables
//! controllers there), which a service inside a delegated subtree may not
//! touch, and 0.5 pulls in a D-Bus client; the part needed here is a dozen
//! files.

use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The controllers a confined tree is limited by.
pub const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// CFS period: quotas are in microseconds of this (the kernel's default
/// for a new group, not written again).
const PERIOD_US: u64 = 100_000;

/// Where groups are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Root {
    /// One unified hierarchy: `dir` is the appliance's subtree with
    /// `cpu memory pids` enabled for its children.
    V2 {
        /// The subtree.
        dir: PathBuf,
    },
    /// One directory per controller (`cpu`, `memory`, `pids`, and
    /// `cpuacct` when it is mounted apart, for CPU time), each under the
    /// appliance's own group; `unified` is a v2 directory beside them
    /// (hybrid hosts), used to kill a tree at once.
    V1 {
        /// `(controller, directory)`.
        dirs: Vec<(&'static str, PathBuf)>,
        /// The v2 subtree of a hybrid host, when writable.
        unified: Option<PathBuf>,
    },
}

/// What a group is limited to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// CPU time per period, in microseconds of [`PERIOD_US`]; 0 is none.
    pub cpu_quota_us: u64,
    /// Memory, bytes (swap is off).
    pub memory_bytes: u64,
    /// Processes and threads.
    pub pids: u32,
}

impl Limits {
    /// Limits of `cpus` CPUs (thousandths), `memory_bytes` and `pids`.
    pub fn of(cpu_milli: u64, memory_bytes: u64, pids: u32) -> Limits {
        Limits {
            cpu_quota_us: (cpu_milli * PERIOD_US / 1000).max(1000),
            memory_bytes,
            pids,
        }
    }
}

/// What a group used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Used {
    /// The most memory it held at once, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// CPU time, microseconds.
    pub cpu_us: Option<u64>,
    /// Processes the kernel's OOM killer ended for the memory limit.
    pub oom_kills: u64,
    /// Forks refused for the process limit.
    pub pids_refused: u64,
}

/// How many ended groups may wait to be removed apart
/// ([`Group::remove_later`]).
const REMOVING: usize = 256;

/// When a tool last started: milliseconds since [`since`]'s start.
static LAST_START: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Milliseconds since the first call.
fn since() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Notes that a tool is starting: what is removed apart waits for a
/// quiet moment.
pub fn starting() {
    LAST_START.store(since(), std::sync::atomic::Ordering::Relaxed);
}

/// Waits until no tool has started for [`super::spawner::QUIET`].
fn quiet() {
    loop {
        let waited = std::time::Duration::from_millis(
            since().saturating_sub(LAST_START.load(std::sync::atomic::Ordering::Relaxed)),
        );
        match super::spawner::QUIET.checked_sub(waited) {
            Some(left) if !left.is_zero() => std::thread::sleep(left),
            _ => return,
        }
    }
}

/// One group: a directory per hierarchy it is in.
#[derive(Debug)]
pub struct Group {
    root: Root,
    /// `(controller, directory)`; one `("", dir)` for v2.
    dirs: Vec<(&'static str, PathBuf)>,
    /// Where `cgroup.kill` is, if anywhere.
    kill: Option<PathBuf>,
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    fs::write(dir.join(file), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{}/{file} <- {value}: {e}", dir.display()),
        )
    })
}

fn read(dir: &Path, file: &str) -> Option<String> {
    fs::read_to_string(dir.join(file)).ok()
}

/// The number after `key` in a flat keyed file (`cpu.stat`,
/// `memory.events`, `pids.events`, `memory.oom_control`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

impl Root {
    /// The mechanism's name, as leases and timelines show it.
    pub fn mechanism(&self) -> &'static str {
        match self {
            Root::V2 { .. } => "cgroup-v2",
            Root::V1 { .. } => "cgroup-v1",
        }
    }

    /// Each hierarchy's directory a group is made in: its controller
    /// (`""` for v2, `"unified"` for a hybrid host's v2 beside v1), the
    /// directory, and whether it may refuse a group (the unified one,
    /// used only to kill a tree at once).
    fn parents(&self) -> Vec<(&'static str, PathBuf, bool)> {
        match self {
            Root::V2 { dir } => vec![("", dir.clone(), false)],
            Root::V1 { dirs, unified } => dirs
                .iter()
                .map(|(c, d)| (*c, d.clone(), false))
                .chain(unified.iter().map(|u| ("unified", u.clone(), true)))
                .collect(),
        }
    }

    /// The files a group's `limits` are written to: the hierarchy (an
    /// index of [`Root::parents`]), the file, the value, and whether the
    /// file must exist (swap's is absent where swap accounting is off,
    /// and there is no swap to turn off then).
    fn limit_files(&self, limits: Limits) -> Vec<(usize, &'static str, String, bool)> {
        let memory = limits.memory_bytes.to_string();
        let pids = limits.pids.to_string();
        match self {
            Root::V2 { .. } => vec![
                (
                    0,
                    "cpu.max",
                    format!("{} {PERIOD_US}", limits.cpu_quota_us),
                    true,
                ),
                (0, "memory.max", memory, true),
                (0, "memory.swap.max", "0".into(), false),
                (0, "pids.max", pids, true),
            ],
            Root::V1 { dirs, .. } => {
                let mut files = Vec::new();
                for (i, (controller, _)) in dirs.iter().enumerate() {
                    match *controller {
                        // The period is the kernel's default (a new
                        // group's); writing it again would visit every
                        // CPU once more.
                        "cpu" => {
                            files.push((
                                i,
                                "cpu.cfs_quota_us",
                                limits.cpu_quota_us.to_string(),
                                true,
                            ));
                        }
                        "memory" => {
                            files.push((i, "memory.limit_in_bytes", memory.clone(), true));
                            files.push((i, "memory.memsw.limit_in_bytes", memory.clone(), false));
                        }
                        "pids" => files.push((i, "pids.max", pids.clone(), true)),
                        _ => {}
                    }
                }
                files
            }
        }
    }

    /// The group of a tool limited by `limits`, as its steps carry it:
    /// the tool spawner makes it and writes its limits, the process joins
    /// it.
    pub fn spec(&self, limits: Limits) -> super::sys::Cgroup {
        let c = |s: &str| CString::new(s).expect("no NUL");
        super::sys::Cgroup::new(
            self.parents()
                .into_iter()
                .map(|(_, d, may_refuse)| {
                    (
                        CString::new(d.into_os_string().into_encoded_bytes()).expect("no NUL"),
                        may_refuse,
                    )
                })
                .collect(),
            self.limit_files(limits)
                .into_iter()
                .map(|(i, file, value, must)| (i, c(file), c(&value), must))
                .collect(),
        )
    }

    /// The group `name` (made by the tool spawner): its directories that
    /// exist.
    pub fn group(&self, name: &str) -> Group {
        let dirs: Vec<(&'static str, PathBuf)> = self
            .parents()
            .into_iter()
            .map(|(c, d, _)| (c, d.join(name)))
            .filter(|(_, d)| d.is_dir())
            .collect();
        let kill = dirs
            .iter()
            .find(|(c, d)| (c.is_empty() || *c == "unified") && d.join("cgroup.kill").exists())
            .map(|(_, d)| d.clone());
        Group {
            root: self.clone(),
            dirs,
            kill,
        }
    }

    /// Makes group `name` with `limits` here, as the tool spawner and the
    /// process do it: the file protocol, checked on plain files.
    #[cfg(test)]
    fn create(&self, name: &str, limits: Limits) -> io::Result<Group> {
        let parents = self.parents();
        for (_, d, _) in &parents {
            fs::create_dir(d.join(name))?;
        }
        for (i, file, value, must) in self.limit_files(limits) {
            let dir = parents[i].1.join(name);
            if must || dir.join(file).exists() {
                write(&dir, file, &value)?;
            }
        }
        Ok(self.group(name))
    }
}

impl Root {
    /// Removes the root's own directories (once its groups are gone).
    pub fn remove(&self) {
        for (_, d, _) in self.parents() {
            let _ = fs::remove_dir(d);
        }
    }

    /// Removes the groups named with `prefix` that no process is in
    /// (the kernel refuses to remove one that is): waits up to half a
    /// second for processes on their way out.
    pub fn remove_empty(&self, prefix: &str) {
        for _ in 0..10 {
            let mut left = false;
            for (_, d, _) in self.parents() {
                for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_name().to_string_lossy().starts_with(prefix)
                        && e.path().is_dir()
                        && fs::remove_dir(e.path()).is_err()
                    {
                        left = true;
                    }
                }
            }
            if !left {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Every group under the root (one per directory the root has):
    /// what a previous run left behind, or what runs at shutdown.
    pub fn groups(&self) -> Vec<Group> {
        let mut names: Vec<String> = self
            .parents()
            .iter()
            .flat_map(|(_, d, _)| {
                fs::read_dir(d)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
            })
            .collect();
        names.sort();
        names.dedup();
        names.into_iter().map(|name| self.group(&name)).collect()
    }
}

impl Group {
    /// The `cgroup.procs` files a process writes itself (`0`) into to
    /// join the group.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// The group's path as the timeline shows it (its first directory).
    pub fn path(&self) -> PathBuf {
        self.dirs
            .first()
            .map(|(_, d)| d.clone())
            .unwrap_or_default()
    }

    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| *c == controller || c.is_empty())
            .map(|(_, d)| d.as_path())
    }

    /// What the group used so far.
    pub fn used(&self) -> Used {
        match &self.root {
            Root::V2 { .. } => {
                let d = self.dir("").expect("a v2 group has its directory");
                Used {
                    peak_memory_bytes: read(d, "memory.peak").and_then(|t| t.trim().parse().ok()),
                    cpu_us: read(d, "cpu.stat").and_then(|t| keyed(&t, "usage_usec")),
                    oom_kills: read(d, "memory.events")
                        .and_then(|t| keyed(&t, "oom_kill"))
                        .unwrap_or(0),
                    pids_refused: read(d, "pids.events")
                        .and_then(|t| keyed(&t, "max"))
                        .unwrap_or(0),
                }
            }
            Root::V1 { .. } => {
                let memory = self.dir("memory");
                let cpu = self.dir("cpuacct").or(self.dir("cpu"));
                Used {
                    peak_memory_bytes: memory
                        .and_then(|d| read(d, "memory.max_usage_in_bytes"))
                        .and_then(|t| t.trim().parse().ok()),
                    cpu_us: cpu
                        .and_then(|d| read(d, "cpuacct.usage"))
                        .and_then(|t| t.trim().parse::<u64>().ok())
                        .map(|ns| ns / 1000),
                    oom_kills: memory
                        .and_then(|d| read(d, "memory.oom_control"))
                        .and_then(|t| keyed(&t, "oom_kill"))
                        .unwrap_or(0),
                    pids_refused: self
                        .dir("pids")
                        .and_then(|d| read(d, "pids.events"))
                        .and_then(|t| keyed(&t, "max"))
                        .unwrap_or(0),
                }
            }
        }
    }

    /// The processes in the group.
    pub fn pids(&self) -> Vec<i32> {
        self.dirs
            .iter()
            .filter_map(|(_, d)| read(d, "cgroup.procs"))
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }

    /// Kills every process in the group, and waits (briefly) until none is
    /// left: with `cgroup.kill` where the kernel has it, else by signalling
    /// each process until the group is empty (a process that forks
    /// meanwhile is found on the next round).
    pub fn kill(&self) {
        if let Some(d) = &self.kill
            && write(d, "cgroup.kill", "1").is_ok()
        {
            for _ in 0..200 {
                if self.pids().is_empty() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        for _ in 0..200 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                super::sys::kill(pid);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Kills what is left of the group's processes now, and removes its
    /// directories apart, after calling `before` on it, on a thread of
    /// idle priority once no tool has started for a moment: removing an
    /// ended tool's group (on cgroup v1 a fraction of a millisecond of the
    /// kernel's work in each hierarchy) does not compete with starting the
    /// next tools. While [`REMOVING`] groups wait, the caller removes its
    /// own. `ended`: the first process of the tool's PID namespace said its
    /// tool ended; it ended the rest of the namespace and is alone in the
    /// group, holding nothing of the tool's, and goes with the group.
    pub fn remove_later(self, ended: bool, before: Option<fn(&Group)>) {
        let left = !ended
            && self
                .dirs
                .first()
                .and_then(|(_, d)| read(d, "cgroup.procs"))
                .is_some_and(|procs| !procs.trim().is_empty());
        if left {
            self.kill();
        }
        type Removal = (Group, Option<fn(&Group)>);
        static REMOVER: std::sync::OnceLock<Option<std::sync::mpsc::SyncSender<Removal>>> =
            std::sync::OnceLock::new();
        let remover = REMOVER.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Removal>(REMOVING);
            std::thread::Builder::new()
                .name("cgroup-remover".into())
                .spawn(move || {
                    // Only when a CPU would otherwise idle (a full queue
                    // falls back to removing in place).
                    let _ = super::sys::idle_priority();
                    for (group, before) in rx {
                        quiet();
                        group.remove_after(before);
                    }
                })
                .ok()
                .map(|_| tx)
        });
        let Some(remover) = remover else {
            return self.remove_after(before);
        };
        if let Err(
            std::sync::mpsc::TrySendError::Full((group, before))
            | std::sync::mpsc::TrySendError::Disconnected((group, before)),
        ) = remover.try_send((self, before))
        {
            group.remove_after(before);
        }
    }

    /// Calls `before` on the group, then removes it.
    fn remove_after(&self, before: Option<fn(&Group)>) {
        if let Some(before) = before {
            before(self);
        }
        self.remove();
    }

    /// Kills what is left and removes the group's directories.
    pub fn remove(&self) {
        self.kill();
        for (_, d) in &self.dirs {
            // An exiting process may keep the group busy for a moment.
            for _ in 0..50 {
                if fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// The group paths of this process, by controller (`""` for v2), from
/// `/proc/self/cgroup`.
pub fn own_paths() -> Vec<(String, String)> {
    let text = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            Some((controllers.to_string(), path.to_string()))
        })
        .collect()
}

/// Where each v1 controller is mounted, and the v2 mount, from
/// `/proc/self/mountinfo`.
pub fn mounts() -> (Vec<(String, PathBuf)>, Option<PathBuf>) {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v1 = Vec::new();
    let mut v2 = None;
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount_point = left.split(' ').nth(4).map(PathBuf::from);
        let mut r = right.split(' ');
        let (fs_type, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
        match (fs_type, mount_point) {
            (Some("cgroup2"), Some(p)) => v2 = Some(p),
            (Some("cgroup"), Some(p)) => {
                for o in options.split(',') {
                    v1.push((o.to_string(), p.clone()));
                }
            }
            _ => {}
        }
    }
    (v1, v2)
}

/// The appliance's subtree on a v2-only host, made ready for groups: the
/// appliance moves itself into a leaf (`supervisor`) of its own group, so
/// that controllers can be enabled for the group's children (a group with
/// processes may not have controllers enabled below it), and groups go
/// under `tools`. Under systemd this needs `Delegate=yes`.
pub fn prepare_v2(mount: &Path, own: &str, instance: &str) -> Result<Root, String> {
    let base = mount.join(own.trim_start_matches('/'));
    let available = read(&base, "cgroup.controllers").unwrap_or_default();
    let missing: Vec<&str> = CONTROLLERS
        .iter()
        .copied()
        .filter(|c| !available.split_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "cgroup v2 group {} lacks the controllers {} (under systemd: Delegate=yes)",
            base.display(),
            missing.join(", ")
        ));
    }
    let enable = CONTROLLERS
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    let e = |e: io::Error| format!("cgroup v2 subtree {}: {e}", base.display());
    // A group with controllers for its children holds no process of its
    // own: the appliance moves into a leaf beside its tools. The host's
    // root group is exempt; the root of a container's cgroup namespace is
    // not, which the kernel says with EBUSY.
    let into_leaf = || -> io::Result<()> {
        let leaf = base.join("supervisor");
        if !leaf.exists() {
            fs::create_dir(&leaf)?;
        }
        write(&leaf, "cgroup.procs", &std::process::id().to_string())
    };
    if own != "/" {
        into_leaf().map_err(e)?;
    }
    match write(&base, "cgroup.subtree_control", &enable) {
        Err(busy) if own == "/" && busy.kind() == io::ErrorKind::ResourceBusy => {
            into_leaf().map_err(e)?;
            write(&base, "cgroup.subtree_control", &enable).map_err(e)?;
        }
        done => done.map_err(e)?,
    }
    let mut dir = base.clone();
    for part in ["agentbay-tools", instance] {
        dir = dir.join(part);
        if !dir.exists() {
            fs::create_dir(&dir).map_err(e)?;
        }
        write(&dir, "cgroup.subtree_control", &enable).map_err(e)?;
    }
    Ok(Root::V2 { dir })
}

/// The appliance's v1 subtrees (`agentbay-tools/<instance>` under its own
/// group of each controller), where each controller is mounted and
/// writable.
pub fn prepare_v1(
    v1: &[(String, PathBuf)],
    v2: Option<&Path>,
    own: &[(String, String)],
    instance: &str,
) -> Result<Root, String> {
    let own_path = |controller: &str| {
        own.iter()
            .find(|(cs, _)| cs.split(',').any(|c| c == controller))
            .map(|(_, p)| p.clone())
    };
    let mut dirs = Vec::new();
    for controller in CONTROLLERS.iter().copied().chain(["cpuacct"]) {
        let Some((_, mount)) = v1.iter().find(|(o, _)| o == controller) else {
            if controller == "cpuacct" {
                continue;
            }
            return Err(format!(
                "the cgroup v1 controller {controller} is not mounted"
            ));
        };
        // cpu and cpuacct mounted together are one directory.
        if dirs
            .iter()
            .any(|(_, d): &(&str, PathBuf)| d.starts_with(mount))
        {
            continue;
        }
        let path = own_path(controller).unwrap_or_else(|| "/".into());
        let d = mount
            .join(path.trim_start_matches('/'))
            .join("agentbay-tools")
            .join(instance);
        if !d.exists() {
            fs::create_dir_all(&d)
                .map_err(|e| format!("cgroup v1 {controller} subtree {}: {e}", d.display()))?;
        }
        dirs.push((controller, d));
    }
    // A hybrid host's unified hierarchy has no controllers, but kills a
    // tree at once.
    let unified = v2.and_then(|m| {
        let path = own_path("").unwrap_or_else(|| "/".into());
        let d = m
            .join(path.trim_start_matches('/'))
            .join("agentbay-tools")
            .join(instance);
        (d.exists() || fs::create_dir_all(&d).is_ok()).then_some(d)
    });
    Ok(Root::V1 { dirs, unified })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v2 subtree (a directory with the kernel's files as plain
    /// files): the file protocol of a group, limits and statistics.
    #[test]
    fn a_v2_group_writes_its_limits_and_reads_its_use() {
        let root = tempfile::tempdir().unwrap();
        let r = Root::V2 {
            dir: root.path().to_path_buf(),
        };
        let g = r.create("t1", Limits::of(500, 64 << 20, 32)).unwrap();
        let d = root.path().join("t1");
        assert_eq!(
            fs::read_to_string(d.join("cpu.max")).unwrap(),
            "50000 100000"
        );
        assert_eq!(
            fs::read_to_string(d.join("memory.max")).unwrap(),
            (64u64 << 20).to_string()
        );
        assert_eq!(fs::read_to_string(d.join("pids.max")).unwrap(), "32");
        fs::write(d.join("memory.peak"), "1234\n").unwrap();
        fs::write(d.join("cpu.stat"), "usage_usec 5000\nuser_usec 4000\n").unwrap();
        fs::write(
            d.join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        )
        .unwrap();
        fs::write(d.join("pids.events"), "max 2\n").unwrap();
        assert_eq!(
            g.used(),
            Used {
                peak_memory_bytes: Some(1234),
                cpu_us: Some(5000),
                oom_kills: 1,
                pids_refused: 2
            }
        );
        assert_eq!(g.procs_files(), vec![d.join("cgroup.procs")]);
        assert_eq!(r.mechanism(), "cgroup-v2");
    }

    /// A v2 subtree is prepared only where its controllers are delegated.
    #[test]
    fn a_v2_subtree_without_its_controllers_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpu io\n").unwrap();
        let err = prepare_v2(root.path(), "/", "i1").unwrap_err();
        assert!(err.contains("memory, pids"), "{err}");
        assert!(err.contains("Delegate=yes"), "{err}");
    }

    #[test]
    fn keyed_files_are_read_by_key() {
        assert_eq!(keyed("usage_usec 12\nuser_usec 3", "usage_usec"), Some(12));
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 4", "oom_kill"),
            Some(4)
        );
        assert_eq!(keyed("max 0", "oom_kill"), None);
    }
}
