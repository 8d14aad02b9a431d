//! What a confined process does to itself between fork and exec, and the
//! few calls the parent makes on it. Between fork and exec only
//! async-signal-safe calls are allowed (the appliance is multi-threaded):
//! every step here is one system call on buffers prepared before the
//! fork, and nothing allocates.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

/// Everything the child applies to itself, prepared in the parent (the
/// appliance, or the tool spawner from the appliance's order).
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Steps {
    /// The group it runs in and its limits.
    pub cgroup: Option<Cgroup>,
    /// `RLIMIT_AS`, bytes (the weaker mechanism's memory bound).
    pub address_space: Option<u64>,
    /// `RLIMIT_NPROC` (the weaker mechanism's process bound).
    pub processes: Option<u64>,
    /// The namespaces it leaves the host's for.
    pub namespaces: Option<Namespaces>,
    /// The user and group to become on the host (the appliance runs as
    /// root; its tools do not).
    pub user: Option<(libc::uid_t, libc::gid_t)>,
    /// How it restricts its files with Landlock.
    pub landlock: Option<Landlock>,
    /// Whether the system-call filter is installed, last.
    pub filter: bool,
}

/// How a process restricts its files with Landlock.
#[derive(Clone, Serialize, Deserialize)]
pub enum Landlock {
    /// By the ruleset the appliance made of the host's paths (a process
    /// without a world of its own): its descriptor.
    Ruleset(RawFd),
    /// By a ruleset it makes once its world is its root, a tree that
    /// holds nothing it may not read: read beneath `/`; read and write
    /// beneath `writable` (its working directory and its `/tmp`) and the
    /// `devices` (files, where each is). `handled`: every right the
    /// kernel governs, all of which a read-write rule grants.
    World {
        handled: u64,
        writable: Vec<CString>,
        devices: Vec<CString>,
    },
}

/// A tool's cgroup: made and limited by the tool spawner (a group named
/// for the process, in each hierarchy), joined by the process before its
/// order (a process made ahead is in its group already; once its order
/// comes the spawner writes the limits it lacks).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cgroup {
    /// The directory of each hierarchy the group is made in, and whether
    /// the hierarchy may refuse one (a hybrid host's unified hierarchy,
    /// used to kill a tree at once, and only where it lets the appliance).
    pub parents: Vec<(CString, bool)>,
    /// The limit files written in the group: the hierarchy (an index of
    /// `parents`), the file, the value, and whether the file must exist
    /// (one the kernel lacks where there is no swap is skipped).
    pub limits: Vec<(usize, CString, CString, bool)>,
    /// The group made for the process. Set by the spawner, never sent.
    #[serde(skip)]
    made: Option<MadeGroup>,
}

/// A group made: its name, its directory in each hierarchy where one was
/// made, and as paths the files the process writes (`cgroup.procs` of
/// each directory; each limit file with its value and whether it must
/// exist).
#[derive(Clone, Debug, Default, PartialEq)]
struct MadeGroup {
    name: String,
    dirs: Vec<Option<CString>>,
    procs: Vec<CString>,
    limits: Vec<(CString, CString, bool)>,
}

impl Cgroup {
    /// A group made in each of `parents`, limited by `limits` (see the
    /// fields).
    pub fn new(
        parents: Vec<(CString, bool)>,
        limits: Vec<(usize, CString, CString, bool)>,
    ) -> Cgroup {
        Cgroup {
            parents,
            limits,
            made: None,
        }
    }

    /// Names the group `name`: its directory in each hierarchy, not made
    /// yet ([`Cgroup::make`]).
    pub fn plan(&mut self, name: &str) {
        self.made = Some(MadeGroup {
            name: name.to_string(),
            dirs: self
                .parents
                .iter()
                .map(|(parent, _)| Some(join_path(parent, name)))
                .collect(),
            ..MadeGroup::default()
        });
        self.resolve();
    }

    /// Makes the named group's directories: refused if a hierarchy that
    /// may not refuse does (what was made is removed then).
    pub fn make(&mut self) -> io::Result<()> {
        let Some(made) = self.made.as_mut() else {
            return Ok(());
        };
        let mut refused = None;
        for (dir, (_, may_refuse)) in made.dirs.iter_mut().zip(&self.parents) {
            let Some(path) = dir.as_ref() else { continue };
            // SAFETY: a NUL-terminated path.
            match check(unsafe { libc::mkdir(path.as_ptr(), 0o755) }) {
                Ok(()) => {}
                Err(_) if *may_refuse => *dir = None,
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = refused {
            self.remove();
            return Err(e);
        }
        self.resolve();
        Ok(())
    }

    /// Takes the group `other` made (a process made ahead, whose group
    /// these limits are for).
    pub fn take_group(&mut self, other: &Cgroup) {
        self.made = other.made.clone();
        self.resolve();
    }

    /// The files the process writes, as paths in the group made.
    fn resolve(&mut self) {
        let Some(made) = &mut self.made else { return };
        made.procs = made
            .dirs
            .iter()
            .flatten()
            .map(|d| join_path(d, "cgroup.procs"))
            .collect();
        made.limits = self
            .limits
            .iter()
            .filter_map(|(i, file, value, must)| {
                let dir = made.dirs.get(*i)?.as_ref()?;
                Some((
                    join_path(dir, &file.to_string_lossy()),
                    value.clone(),
                    *must,
                ))
            })
            .collect();
    }

    /// Removes the directories [`Cgroup::make`] made (empty by then; one
    /// never made is skipped).
    pub fn remove(&mut self) {
        for dir in self
            .made
            .take()
            .map(|m| m.dirs)
            .unwrap_or_default()
            .into_iter()
            .flatten()
        {
            // SAFETY: a NUL-terminated path.
            unsafe { libc::rmdir(dir.as_ptr()) };
        }
    }

    /// The group's name, once named.
    pub fn name(&self) -> Option<String> {
        self.made.as_ref().map(|m| m.name.clone())
    }

    /// Joins the group (the calling process and what it starts).
    fn join(&self) -> io::Result<()> {
        for procs in self.made.iter().flat_map(|m| &m.procs) {
            write_file(procs, b"0")?;
        }
        Ok(())
    }

    /// Writes the group's limits (the spawner, once it knows the order:
    /// the process may no longer see the cgroup filesystem), but those
    /// `written` (the same group's, written before) holds already: a
    /// CPU quota's write, for one, visits every CPU.
    pub fn limit(&self, written: Option<&Cgroup>) -> io::Result<()> {
        let before = written.and_then(|w| w.made.as_ref()).map(|m| &m.limits[..]);
        for limit @ (file, value, must) in self.made.iter().flat_map(|m| &m.limits) {
            if before.is_some_and(|b| b.contains(limit)) {
                continue;
            }
            match write_file(file, value.as_bytes()) {
                Err(e) if !must && e.raw_os_error() == Some(libc::ENOENT) => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// `dir/name` as a C string.
fn join_path(dir: &CStr, name: &str) -> CString {
    let mut path = dir.to_bytes().to_vec();
    path.push(b'/');
    path.extend_from_slice(name.as_bytes());
    CString::new(path).expect("no NUL in a cgroup path")
}

/// What [`Steps::apply_ahead`] does, compared: the namespaces it is
/// cloned into and makes, its user namespace's maps, its network, its
/// PID namespace, the world's root and shared places, and the
/// hierarchies of its group.
#[derive(Debug, PartialEq)]
pub struct Blank<'a> {
    flags: libc::c_int,
    maps: Option<(&'a CStr, &'a CStr)>,
    network: bool,
    pid: bool,
    world: Option<(&'a CStr, &'a CStr, &'a [Place])>,
    cgroup: Option<&'a [(CString, bool)]>,
    filter: bool,
}

/// The namespaces a clone makes with the process (the rest it makes
/// itself): a user namespace first, which owns the rest, and the PID
/// namespace, which only a new process enters.
const CLONED: libc::c_int = libc::CLONE_NEWUSER | libc::CLONE_NEWPID;

/// The most site endpoints one tool process may be offered.
pub const MAX_LISTENERS: usize = crate::domain::reach::MAX_SITE_ENDPOINTS;

/// How a tool's user namespace gets its ids.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum UserMaps {
    /// The appliance's own uid and gid only, written by the child itself
    /// (no subordinate range): the tool shares the appliance's uid.
    Own(CString, CString),
    /// Written by the appliance with `newuidmap`/`newgidmap` (the
    /// account's subordinate range): the child sends its pid on `ready`
    /// and waits for one byte on `go`, 0 when its maps are written.
    Mapped {
        /// The child's end of the pipe it sends its pid on.
        ready: RawFd,
        /// The child's end of the pipe it hears the answer on.
        go: RawFd,
    },
    /// An existing user namespace the appliance owns (its
    /// `/proc/<pid>/ns/user`, open), joined with `setns`: the child is its
    /// root, with every capability there.
    Join(RawFd),
}

/// Which namespaces a process makes for itself, and what it does in them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Namespaces {
    /// A user namespace, and how its ids are mapped (the appliance is not
    /// root); `None` as root, which needs none.
    pub user_maps: Option<UserMaps>,
    /// A network namespace with only loopback.
    pub network: bool,
    /// That namespace made ahead, open (the tool spawner's pool): joined
    /// instead of made. Set by the spawner, never sent.
    #[serde(skip)]
    pub network_from: Option<RawFd>,
    /// A PID namespace and a `/proc` of its own (in a mount namespace of
    /// its own): the tool runs as its namespace's first process, under a
    /// parent that waits for it, and sees no host process.
    pub pid: bool,
    /// The filesystem built for it, in a mount namespace of its own.
    pub world: Option<World>,
    /// The ids to take inside the user namespace once the world is built
    /// (a subordinate uid and gid, mapped there as these).
    pub become_ids: Option<(libc::uid_t, libc::gid_t)>,
    /// Ports to listen on at `127.0.0.1` inside the new network (the site
    /// endpoints the appliance forwards), and the socket the listeners are
    /// sent back to the appliance over.
    pub listen: Vec<u16>,
    /// The child's end of that socket.
    pub listeners_to: Option<RawFd>,
}

/// A tool's filesystem: a fresh tmpfs assembled at `base` (an empty
/// directory, in the tool's own mount namespace), which then becomes its
/// `/`. Every path below already starts with `base`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct World {
    /// Where the root is assembled.
    pub base: CString,
    /// The root tmpfs's mount options.
    pub options: CString,
    /// What goes in it, in order.
    pub places: Vec<Place>,
    /// How many of `places`, from the first, every tool's world has
    /// (made by a process made ahead, before its order).
    pub shared: usize,
    /// Its working directory, as the tool sees it (after the pivot).
    pub cwd: CString,
    /// Whether the root is pivoted into once the shared places are made
    /// (its own places then come as trees, paths of the tool's root:
    /// [`World::bind_as_trees`]); otherwise once all are.
    #[serde(default)]
    pub pivoted: bool,
}

/// One thing put in a tool's world.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Place {
    /// A directory (mode 0755).
    Dir(CString),
    /// An empty file, for a file to be mounted on.
    File(CString),
    /// A symbolic link `at` -> `to`.
    Link {
        /// What it points at.
        to: CString,
        /// Where it is.
        at: CString,
    },
    /// The file or tree `from` (a path the parent judged) mounted at
    /// `at`: read-only unless `write`; device files usable only with
    /// `dev`; never set-uid.
    Bind {
        /// The source.
        from: CString,
        /// The mount point.
        at: CString,
        /// Writable.
        write: bool,
        /// Device files work.
        dev: bool,
    },
    /// A tmpfs with `options` (read-only with `read_only`: a mask over a
    /// protected directory).
    Tmpfs {
        /// The mount point.
        at: CString,
        /// Its options (size, mode).
        options: CString,
        /// Mounted read-only.
        read_only: bool,
    },
    /// A `/proc` of its PID namespace.
    Proc(CString),
    /// A detached tree (`open_tree`, open as `tree`, its flags set
    /// already) attached at `at`: a [`Place::Bind`] made by the tool
    /// spawner, which sees the host's paths, for a process whose root is
    /// its world already.
    Tree {
        /// The tree.
        tree: RawFd,
        /// The mount point.
        at: CString,
    },
    /// The directory open as `fd` given to `uid`:`gid` (ids of the tool's
    /// user namespace): its working directory, made its own.
    Own {
        /// The directory.
        fd: RawFd,
        /// The owner.
        uid: libc::uid_t,
        /// The group.
        gid: libc::gid_t,
    },
}

impl Namespaces {
    /// The namespaces this process can make: a user namespace too unless
    /// it is root, mapping its own ids only.
    pub fn for_this_process(network: bool, pid: bool) -> Namespaces {
        Namespaces {
            user_maps: own_maps(),
            network,
            pid,
            ..Namespaces::default()
        }
    }
}

/// The maps of a user namespace holding only this process's own ids
/// (none as root, which needs no user namespace).
pub fn own_maps() -> Option<UserMaps> {
    let (uid, gid) = ids();
    (uid != 0).then(|| {
        UserMaps::Own(
            CString::new(format!("{uid} {uid} 1\n")).expect("no NUL"),
            CString::new(format!("{gid} {gid} 1\n")).expect("no NUL"),
        )
    })
}

/// This process's effective uid and gid.
pub fn ids() -> (libc::uid_t, libc::gid_t) {
    // SAFETY: geteuid and getegid cannot fail and touch no memory.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `data` to the file at `path` (open, write, close).
fn write_file(path: &CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: path is NUL-terminated; data is a valid buffer; the fd is
    // closed on every path.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n < 0 {
            return Err(err);
        }
    }
    Ok(())
}

const SETGROUPS: &CStr = c"/proc/self/setgroups";
const UID_MAP: &CStr = c"/proc/self/uid_map";
const GID_MAP: &CStr = c"/proc/self/gid_map";

/// Brings the loopback interface of the current network namespace up.
fn loopback_up() -> io::Result<()> {
    // SAFETY: a zeroed ifreq is valid; the name fits its array; the socket
    // is closed on every path.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let mut r = libc::ioctl(sock, libc::SIOCGIFFLAGS as _, &mut req);
        if r >= 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(sock, libc::SIOCSIFFLAGS as _, &req);
        }
        let err = io::Error::last_os_error();
        libc::close(sock);
        if r < 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// Sets the signal a process gets when its parent dies (cleared by every
/// change of credentials, so set again after one).
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: a flag on the calling process.
    check(unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    })
}

impl Steps {
    /// Only a user namespace mapped by `maps` (and so root of it).
    pub fn in_user_namespace(maps: UserMaps) -> Steps {
        Steps {
            namespaces: Some(Namespaces {
                user_maps: Some(maps),
                ..Namespaces::default()
            }),
            ..Steps::default()
        }
    }

    /// The namespaces the tool spawner clones a child into, with the
    /// process itself: the child is its PID namespace's first process from
    /// the start, with no second fork and no parent waiting for it but
    /// the spawner. Its other namespaces (the costly ones: a copy of the
    /// mount table, a network) it makes itself, in parallel with other
    /// starts, not in the spawner. Then [`Steps::apply_ahead`] and
    /// [`Steps::apply_rest`].
    pub fn clone_flags(&self) -> libc::c_int {
        self.namespaces.as_ref().map_or(0, |ns| ns.flags() & CLONED)
    }

    /// What a process made ahead for these steps has done before its
    /// order comes ([`Steps::apply_ahead`]): steps with the same blank
    /// can be finished by it. `None` where no process can be made ahead
    /// (its user namespace's maps are written by the appliance for it, or
    /// it joins one).
    pub fn blank(&self) -> Option<Blank<'_>> {
        let (maps, network, pid, world) = match &self.namespaces {
            None => (None, false, false, None),
            Some(ns) => {
                let maps = match &ns.user_maps {
                    None => None,
                    Some(UserMaps::Own(uid, gid)) => Some((uid.as_c_str(), gid.as_c_str())),
                    Some(UserMaps::Mapped { .. } | UserMaps::Join(_)) => return None,
                };
                let world = ns.world.as_ref().map(|w| {
                    (
                        w.base.as_c_str(),
                        w.options.as_c_str(),
                        &w.places[..w.shared.min(w.places.len())],
                    )
                });
                (maps, ns.network, ns.pid, world)
            }
        };
        Some(Blank {
            flags: self.clone_flags(),
            maps,
            network,
            pid,
            world,
            cgroup: self.cgroup.as_ref().map(|c| &c.parents[..]),
            filter: self.filter,
        })
    }

    /// Applies the steps to the calling process. Runs between fork and
    /// exec: see the module's note.
    pub fn apply(&self) -> io::Result<()> {
        self.apply_ahead(false)?;
        self.apply_rest()
    }

    /// What of the steps a process can take before it knows what it will
    /// run (a process made ahead, [`Steps::blank`]): its group, its
    /// session, its namespaces, the part of its world every tool shares
    /// and the filter but its mount calls. `cloned`: made by a clone with
    /// [`Steps::clone_flags`].
    pub fn apply_ahead(&self, cloned: bool) -> io::Result<()> {
        if let Some(group) = &self.cgroup {
            group.join()?;
        }
        // SAFETY: a plain system call.
        check(unsafe { libc::setsid() })?;
        if let Some(ns) = &self.namespaces {
            ns.enter(cloned)?;
        }
        if self.filter {
            install_filter(super::filter::Programs::ahead)?;
        }
        Ok(())
    }

    /// The rest, once the process knows what it runs (its group's limits
    /// are written by the spawner): its rlimits, its own part of the
    /// world and the root's pivot, its identity, Landlock and the last of
    /// the filter. After [`Steps::apply_ahead`] of steps with the same
    /// [`Steps::blank`].
    pub fn apply_rest(&self) -> io::Result<()> {
        // SAFETY: plain system calls on values.
        unsafe {
            if let Some(bytes) = self.address_space {
                let l = libc::rlimit {
                    rlim_cur: bytes as libc::rlim_t,
                    rlim_max: bytes as libc::rlim_t,
                };
                check(libc::setrlimit(libc::RLIMIT_AS, &l))?;
            }
            if let Some(n) = self.processes {
                let l = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                check(libc::setrlimit(libc::RLIMIT_NPROC, &l))?;
            }
        }
        if let Some(ns) = &self.namespaces {
            ns.settle()?;
        }
        if let Some((uid, gid)) = self.user {
            // SAFETY: plain system calls on values.
            unsafe {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(gid))?;
                check(libc::setuid(uid))?;
            }
            if self.namespaces.as_ref().is_some_and(|n| n.pid) {
                die_with_parent()?;
            }
        }
        match &self.landlock {
            None => {}
            Some(Landlock::Ruleset(fd)) => restrict_self(*fd)?,
            Some(Landlock::World {
                handled,
                writable,
                devices,
            }) => {
                let fd = new_ruleset(*handled)?;
                let rules = std::iter::once((c"/", READ))
                    .chain(writable.iter().map(|w| (w.as_c_str(), *handled)))
                    .chain(devices.iter().map(|d| (d.as_c_str(), *handled & FILE)))
                    .try_for_each(|(path, access)| match allow(fd, path, access) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                        done => done,
                    });
                let restricted = rules.and_then(|()| restrict_self(fd));
                close(fd);
                restricted?;
            }
        }
        if self.filter {
            install_filter(|p| std::iter::once(p.last()))?;
        }
        Ok(())
    }

    /// Every descriptor the steps name, to renumber: the tool spawner
    /// receives them under numbers of its own.
    pub fn descriptors(&mut self) -> Vec<&mut RawFd> {
        let mut fds: Vec<&mut RawFd> = Vec::new();
        if let Some(Landlock::Ruleset(fd)) = &mut self.landlock {
            fds.push(fd);
        }
        if let Some(ns) = &mut self.namespaces {
            match &mut ns.user_maps {
                Some(UserMaps::Join(fd)) => fds.push(fd),
                Some(UserMaps::Mapped { ready, go }) => {
                    fds.push(ready);
                    fds.push(go);
                }
                Some(UserMaps::Own(..)) | None => {}
            }
            if let Some(fd) = &mut ns.listeners_to {
                fds.push(fd);
            }
            if let Some(world) = &mut ns.world {
                for place in &mut world.places {
                    if let Place::Own { fd, .. } | Place::Tree { tree: fd, .. } = place {
                        fds.push(fd);
                    }
                }
            }
        }
        fds
    }
}

impl Namespaces {
    /// The namespaces it makes: a user namespace unless it joins one or
    /// needs none.
    fn flags(&self) -> libc::c_int {
        let mut flags = 0;
        if matches!(
            self.user_maps,
            Some(UserMaps::Own(..) | UserMaps::Mapped { .. })
        ) {
            flags |= libc::CLONE_NEWUSER;
        }
        if self.network && self.network_from.is_none() {
            flags |= libc::CLONE_NEWNET;
        }
        if self.pid {
            flags |= libc::CLONE_NEWPID;
        }
        if self.pid || self.world.is_some() {
            flags |= libc::CLONE_NEWNS;
        }
        flags
    }

    /// Leaves the host's namespaces (`cloned`: the clone that made the
    /// process already did). Runs between fork and exec.
    fn enter(&self, cloned: bool) -> io::Result<()> {
        let flags = self.flags();
        if cloned && self.pid {
            // Its parent is the spawner: the tool dies with it.
            die_with_parent()?;
        }
        // The clone made the user and PID namespaces; the rest are made
        // here.
        let rest = flags & !CLONED;
        match &self.user_maps {
            None if cloned => check(unsafe { libc::unshare(rest) })?,
            None => check(unsafe { libc::unshare(flags) })?,
            // The spawner cannot join a user namespace for one child: it
            // joins the tools' own once, at start.
            Some(UserMaps::Join(_)) if cloned => {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            Some(UserMaps::Join(userns)) => {
                // SAFETY: plain system calls on a descriptor the parent
                // holds open.
                unsafe {
                    check(libc::setns(*userns, libc::CLONE_NEWUSER))?;
                    check(libc::unshare(flags))?;
                }
            }
            Some(maps) => {
                // The appliance is not dumpable, and the /proc files of a
                // process that is not dumpable belong to root: neither it
                // nor newuidmap could write its maps. It is dumpable until
                // they are written only; its memory is still the
                // appliance's copy, but no tool can see it then (every
                // tool of an unprivileged appliance runs in a PID
                // namespace of its own).
                // SAFETY: flags on the calling process; plain system calls.
                unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
                let made = if cloned {
                    check(unsafe { libc::unshare(rest) })
                } else {
                    check(unsafe { libc::unshare(flags) })
                };
                let written = made.and_then(|()| match maps {
                    UserMaps::Own(uid_map, gid_map) => write_file(SETGROUPS, b"deny")
                        .and_then(|()| write_file(UID_MAP, uid_map.as_bytes()))
                        .and_then(|()| write_file(GID_MAP, gid_map.as_bytes())),
                    UserMaps::Mapped { ready, go } => wait_for_maps(*ready, *go),
                    UserMaps::Join(_) => Err(io::Error::from_raw_os_error(libc::EINVAL)),
                });
                unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
                written?;
            }
        }
        if self.network {
            match self.network_from {
                // SAFETY: a plain system call on a descriptor the spawner
                // passed down.
                Some(net) => check(unsafe { libc::setns(net, libc::CLONE_NEWNET) })?,
                None => loopback_up()?,
            }
        }
        if self.pid && !cloned {
            become_first_process()?;
        }
        if let Some(world) = &self.world {
            world.build_shared(self.pid)?;
        }
        Ok(())
    }

    /// What [`Namespaces::enter`] leaves to the order: the listeners of
    /// its site endpoints, its own part of the world and the pivot into
    /// it, and its ids.
    fn settle(&self) -> io::Result<()> {
        if self.network {
            self.send_listeners()?;
        }
        if let Some(world) = &self.world {
            world.finish(self.pid)?;
        }
        if let Some((uid, gid)) = self.become_ids {
            // SAFETY: plain system calls on values. Supplementary groups
            // are dropped where the namespace allows it (newgidmap denies
            // setgroups when it maps the caller's own group, which the
            // tool then keeps: the appliance's account has only its own).
            unsafe {
                let r = libc::setgroups(0, std::ptr::null());
                if r != 0 && *libc::__errno_location() != libc::EPERM {
                    return Err(io::Error::last_os_error());
                }
                check(libc::setresgid(gid, gid, gid))?;
                check(libc::setresuid(uid, uid, uid))?;
            }
            if self.pid {
                die_with_parent()?;
            }
        }
        Ok(())
    }

    /// Listens on each port at `127.0.0.1` inside the new network and
    /// sends the listeners to the appliance (`SCM_RIGHTS`): a socket keeps
    /// the namespace it was made in, and the appliance, unprivileged, may
    /// not enter this one itself.
    fn send_listeners(&self) -> io::Result<()> {
        let Some(to) = self.listeners_to else {
            return Ok(());
        };
        if self.listen.len() > MAX_LISTENERS {
            return Err(io::Error::from_raw_os_error(libc::E2BIG));
        }
        let mut fds = [-1 as libc::c_int; MAX_LISTENERS];
        for (i, port) in self.listen.iter().enumerate() {
            fds[i] = listen_loopback(*port)?;
        }
        let n = self.listen.len();
        let sent = send_message(to, &[0], &fds[..n]);
        for fd in &fds[..n] {
            // SAFETY: each is a listener made above and owned here.
            unsafe { libc::close(*fd) };
        }
        sent
    }
}

/// Sends this process's pid on `ready` and waits on `go` for the
/// appliance to write its maps: 0 when they are.
fn wait_for_maps(ready: RawFd, go: RawFd) -> io::Result<()> {
    // SAFETY: plain system calls on local buffers.
    unsafe {
        let pid = libc::getpid().to_ne_bytes();
        if libc::write(ready, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
            return Err(io::Error::last_os_error());
        }
        let mut answer = [1u8; 1];
        loop {
            let n = libc::read(go, answer.as_mut_ptr().cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            return Err(io::Error::from_raw_os_error(libc::EPIPE));
        }
        if answer[0] != 0 {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
impl MountAttr {
    /// Read-only unless `write`, not set-uid, without devices unless
    /// `dev`.
    fn restricting(write: bool, dev: bool) -> MountAttr {
        let mut set = MOUNT_ATTR_NOSUID;
        if !write {
            set |= MOUNT_ATTR_RDONLY;
        }
        if !dev {
            set |= MOUNT_ATTR_NODEV;
        }
        MountAttr {
            attr_set: set,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        }
    }
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Makes the mount at `at` and every mount below it read-only (unless
/// `write`), not set-uid and (unless `dev`) without devices.
/// `mount_setattr` adds these to each mount whatever it already has;
/// where the kernel lacks it (before 5.12) the top mount is remounted
/// with its own flags kept, as a user namespace must.
fn restrict(at: &CStr, write: bool, dev: bool) -> io::Result<()> {
    let attr = MountAttr::restricting(write, dev);
    // SAFETY: a NUL-terminated path and a local struct of the kernel's
    // layout and size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            at.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == 0 {
        return Ok(());
    }
    if io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
        return Err(io::Error::last_os_error());
    }
    if write {
        return Ok(());
    }
    // SAFETY: a zeroed statvfs is valid and statvfs fills it.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        check(libc::statvfs(at.as_ptr(), &mut st))?;
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID;
        for (st_flag, ms_flag) in [
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ] {
            if st.f_flag & st_flag != 0 {
                flags |= ms_flag;
            }
        }
        if !dev {
            flags |= libc::MS_NODEV;
        }
        check(libc::mount(
            std::ptr::null(),
            at.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        ))
    }
}

impl World {
    /// Builds the part of the world every tool shares: its root tmpfs
    /// and the first [`World::shared`] places. Runs between fork and exec,
    /// in the tool's own mount namespace.
    fn build_shared(&self, pid: bool) -> io::Result<()> {
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: NUL-terminated paths and options prepared before the
        // fork; plain system calls.
        unsafe {
            // The appliance's umask (0077) would make the world's
            // directories its own; the tool starts with the usual one.
            libc::umask(0o022);
            // Mounts made here stay here.
            check(libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                self.base.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.options.as_ptr().cast(),
            ))?;
        }
        for place in &self.places[..self.shared.min(self.places.len())] {
            place.make(pid)?;
        }
        if self.pivoted {
            // SAFETY: NUL-terminated paths; plain system calls.
            unsafe {
                check(libc::chdir(self.base.as_ptr()))?;
                pivot_here()?;
                check(libc::chdir(c"/".as_ptr()))?;
            }
        }
        Ok(())
    }

    /// Adds the tool's own places and makes the world its root. After
    /// [`World::build_shared`].
    fn finish(&self, pid: bool) -> io::Result<()> {
        for place in self.places.get(self.shared..).unwrap_or_default() {
            place.make(pid)?;
        }
        let null = std::ptr::null::<libc::c_char>();
        let root = if self.pivoted {
            c"/"
        } else {
            self.base.as_c_str()
        };
        // SAFETY: NUL-terminated paths prepared before the fork; plain
        // system calls.
        unsafe {
            // The root itself: nothing more is made in it.
            check(libc::mount(
                null,
                root.as_ptr(),
                null,
                libc::MS_REMOUNT
                    | libc::MS_BIND
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                std::ptr::null(),
            ))?;
            if !self.pivoted {
                check(libc::chdir(self.base.as_ptr()))?;
                pivot_here()?;
            }
            check(libc::chdir(self.cwd.as_ptr()))?;
        }
        Ok(())
    }
}

/// Makes the working directory the root: pivot_root(".", "."), the old
/// root stacked under the new one and detached at once, so nothing of the
/// host's tree is left to reach.
fn pivot_here() -> io::Result<()> {
    // SAFETY: NUL-terminated paths; plain system calls.
    unsafe {
        check(libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int)?;
        check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))
    }
}

impl Place {
    /// Where it is made in the root being assembled, if it is made
    /// there (a tree's place is the tool's already; a change of owner is
    /// made where it is).
    fn assembled_at(&mut self) -> Option<&mut CString> {
        match self {
            Place::Dir(at)
            | Place::File(at)
            | Place::Proc(at)
            | Place::Link { at, .. }
            | Place::Tmpfs { at, .. }
            | Place::Bind { at, .. } => Some(at),
            Place::Own { .. } | Place::Tree { .. } => None,
        }
    }

    /// Puts this place in the world being built (`pid`: the process has a
    /// PID namespace of its own, whose `/proc` it mounts).
    fn make(&self, pid: bool) -> io::Result<()> {
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: NUL-terminated paths and options prepared before the
        // fork; plain system calls.
        unsafe {
            match self {
                Place::Dir(at) => {
                    let r = libc::mkdir(at.as_ptr(), 0o755);
                    if r != 0 && *libc::__errno_location() != libc::EEXIST {
                        return Err(io::Error::last_os_error());
                    }
                }
                Place::File(at) => {
                    let fd = libc::open(
                        at.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(fd);
                }
                Place::Link { to, at } => check(libc::symlink(to.as_ptr(), at.as_ptr()))?,
                Place::Bind {
                    from,
                    at,
                    write,
                    dev,
                } => {
                    check(libc::mount(
                        from.as_ptr(),
                        at.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                    restrict(at, *write, *dev)?;
                }
                Place::Tmpfs {
                    at,
                    options,
                    read_only,
                } => {
                    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
                    if *read_only {
                        flags |= libc::MS_RDONLY | libc::MS_NOEXEC;
                    }
                    check(libc::mount(
                        c"tmpfs".as_ptr(),
                        at.as_ptr(),
                        c"tmpfs".as_ptr(),
                        flags,
                        options.as_ptr().cast(),
                    ))?;
                }
                Place::Proc(at) => {
                    if pid {
                        check(libc::mount(
                            c"proc".as_ptr(),
                            at.as_ptr(),
                            c"proc".as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                            std::ptr::null(),
                        ))?;
                    }
                }
                Place::Own { fd, uid, gid } => check(libc::fchownat(
                    *fd,
                    c"".as_ptr(),
                    *uid,
                    *gid,
                    libc::AT_EMPTY_PATH,
                ))?,
                Place::Tree { tree, at } => check(libc::syscall(
                    libc::SYS_move_mount,
                    *tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    at.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) as libc::c_int)?,
            }
        }
        Ok(())
    }
}

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const OPEN_TREE_CLONE: libc::c_uint = 1;

/// A detached copy of the tree at `from` (with what is mounted below it)
/// with `restrict`'s flags: read-only unless `write`, not set-uid,
/// without devices unless `dev`.
fn open_tree(from: &CStr, write: bool, dev: bool) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path; the descriptor is owned on success.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            from.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        )
    } as libc::c_int;
    check(fd)?;
    // SAFETY: just made, owned here.
    let tree = unsafe { OwnedFd::from_raw_fd(fd) };
    let attr = MountAttr::restricting(write, dev);
    // SAFETY: the tree's descriptor, an empty path and a local struct of
    // the kernel's layout and size.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    } as libc::c_int)?;
    Ok(tree)
}

/// Whether this process can copy trees of its mount namespace
/// (`open_tree`): root of the namespace's owner, on Linux 5.2 and later.
pub fn can_copy_trees() -> bool {
    open_tree(c"/", false, false).is_ok()
}

/// Makes the calling process's mount namespace its own (a copy of its
/// parent's, which keeps receiving what the host mounts): the tool
/// spawner of an unprivileged appliance, root of the tools' user
/// namespace, may then copy trees of it.
pub fn own_mount_namespace() -> io::Result<()> {
    // SAFETY: plain system calls with constant arguments.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ))
    }
}

impl World {
    /// Makes the world's own places (after the shared ones) trees and
    /// paths of the tool's root, for a process that pivots into its root
    /// before they are made: each bind a detached copy made here, by the
    /// tool spawner, which still sees the host's paths. Returns the trees
    /// (their descriptors are in the places).
    pub fn bind_as_trees(&mut self) -> io::Result<Vec<OwnedFd>> {
        let base = self.base.to_bytes().len();
        let inside = |at: &CString| -> CString {
            let rest = &at.as_bytes()[base.min(at.as_bytes().len())..];
            CString::new(if rest.is_empty() { b"/" } else { rest }).expect("no NUL")
        };
        let mut trees = Vec::new();
        for place in self.places.iter_mut().skip(self.shared) {
            if let Place::Bind {
                from,
                at,
                write,
                dev,
            } = place
            {
                let tree = open_tree(from, *write, *dev)?;
                *place = Place::Tree {
                    tree: std::os::fd::AsRawFd::as_raw_fd(&tree),
                    at: inside(at),
                };
                trees.push(tree);
            } else if let Some(at) = place.assembled_at() {
                *at = inside(at);
            }
        }
        self.pivoted = true;
        Ok(trees)
    }
}

/// Installs the part `of` the system-call filter. Compiled before the
/// fork (the confiner and the spawner both compile it first): nothing is
/// allocated here.
fn install_filter<'a, I: IntoIterator<Item = &'a [seccompiler::sock_filter]>>(
    of: impl FnOnce(&'a super::filter::Programs) -> I,
) -> io::Result<()> {
    let programs =
        super::filter::programs().map_err(|_| io::Error::from_raw_os_error(libc::ENOSYS))?;
    super::filter::install(of(programs))
}

/// Landlock's read access: execute, read files, list directories.
const READ: u64 = 1 | (1 << 2) | (1 << 3);
/// Landlock's rights on a file (not a directory): execute, write, read,
/// truncate, device ioctls.
const FILE: u64 = 1 | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15);

/// A new Landlock ruleset that handles `handled` (file-system rights).
fn new_ruleset(handled: u64) -> io::Result<RawFd> {
    // SAFETY: a plain system call on a local struct, the first field of
    // `struct landlock_ruleset_attr` (a size the kernel accepts).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &handled as *const u64,
            std::mem::size_of::<u64>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd as RawFd)
}

/// Restricts the calling process by the Landlock ruleset `fd` (and sets
/// `PR_SET_NO_NEW_PRIVS`, which it needs).
fn restrict_self(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain system calls on values.
    unsafe {
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        check(libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) as libc::c_int)
    }
}

/// Adds a Landlock rule to the ruleset `fd`: `access` beneath `path`.
fn allow(fd: RawFd, path: &CStr, access: u64) -> io::Result<()> {
    /// `struct landlock_path_beneath_attr`.
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    const RULE_PATH_BENEATH: libc::c_int = 1;
    // SAFETY: plain system calls on a NUL-terminated path and a local
    // struct of the kernel's layout; the descriptor is closed on every path.
    unsafe {
        let dir = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
        if dir < 0 {
            return Err(io::Error::last_os_error());
        }
        let attr = PathBeneath {
            allowed_access: access,
            parent_fd: dir,
        };
        let r = libc::syscall(
            libc::SYS_landlock_add_rule,
            fd,
            RULE_PATH_BENEATH,
            &attr as *const PathBeneath,
            0u32,
        );
        let err = io::Error::last_os_error();
        libc::close(dir);
        if r < 0 {
            return Err(err);
        }
    }
    Ok(())
}
/// A listening TCP socket on `127.0.0.1:port`, close-on-exec.
fn listen_loopback(port: u16) -> io::Result<libc::c_int> {
    // SAFETY: plain system calls on a zeroed sockaddr_in; the socket is
    // closed on failure.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = port.to_be();
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let bound = libc::bind(
            fd,
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if bound < 0 || libc::listen(fd, 128) < 0 {
            let err = io::Error::last_os_error();
            libc::close(fd);
            return Err(err);
        }
        Ok(fd)
    }
}

/// Makes the calling process the parent of its PID namespace's first
/// process, which goes on to exec the tool; the parent waits for it and
/// exits as it did. The first process is killed if its parent dies (the
/// appliance kills the parent), and with it every process of the
/// namespace.
fn become_first_process() -> io::Result<()> {
    // SAFETY: fork in a process that then makes only async-signal-safe
    // calls (the caller's contract), waitpid and _exit in the parent.
    unsafe {
        let child = libc::fork();
        if child < 0 {
            return Err(io::Error::last_os_error());
        }
        if child > 0 {
            // The parent holds nothing of the tool's: not its pipes (their
            // ends must close when the tool's do) and not the pipe the
            // appliance reads exec errors from.
            if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
                for fd in 0..1024 {
                    libc::close(fd);
                }
            }
            let mut status = 0;
            loop {
                let r = libc::waitpid(child, &mut status, 0);
                if r == child {
                    break;
                }
                if r < 0 && *libc::__errno_location() != libc::EINTR {
                    libc::_exit(127);
                }
            }
            if libc::WIFEXITED(status) {
                libc::_exit(libc::WEXITSTATUS(status));
            }
            libc::_exit(128 + libc::WTERMSIG(status));
        }
    }
    die_with_parent()
}

/// A pair of connected UNIX sockets of `kind` (`SOCK_DGRAM`,
/// `SOCK_SEQPACKET`; close-on-exec): the appliance's end and the other
/// process's.
pub fn socket_pair(kind: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors socketpair writes.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            kind | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both descriptors were just made and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The most descriptors one message carries.
const MAX_SENT_FDS: usize = 32;
const _: () = assert!(MAX_LISTENERS <= MAX_SENT_FDS);

/// Sends `data` and the descriptors `fds` (at most [`MAX_SENT_FDS`]) over
/// `to` as one message (`SCM_RIGHTS`), whole or not at all. Allocates
/// nothing: a child sends its listeners with it between fork and exec.
pub fn send_message(to: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_SENT_FDS {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let data_len = std::mem::size_of_val(fds) as u32;
    // An aligned buffer for one control message of up to MAX_SENT_FDS
    // descriptors (CMSG_SPACE of 128 bytes is 144).
    let mut control = [0u64; 4 + MAX_SENT_FDS / 2];
    // SAFETY: every pointer is to a live buffer of the size given; the
    // control buffer is larger than CMSG_SPACE(data_len).
    unsafe {
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(data_len) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                data_len as usize,
            );
        }
        loop {
            let sent = libc::sendmsg(to, &msg, libc::MSG_NOSIGNAL);
            if sent >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// One message from `from` into `buf` and the descriptors that came with
/// it (close-on-exec, at most `max_fds`): its length, 0 at the end. A
/// message longer than `buf`, or with more descriptors, is refused whole.
pub fn receive_message(
    from: RawFd,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let space = unsafe { libc::CMSG_SPACE((max_fds * std::mem::size_of::<libc::c_int>()) as u32) };
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    // SAFETY: pointers to live buffers of the sizes given; each
    // descriptor received is taken into ownership once.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let got = loop {
            let got = libc::recvmsg(from, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if got >= 0 {
                break got as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        Ok((got, fds))
    }
}

/// Waits for the next message on `socket` (of datagrams or sequenced
/// packets) and returns its size, leaving it to be received; 0 once the
/// other end is closed.
pub fn next_message_size(socket: RawFd) -> io::Result<usize> {
    loop {
        // SAFETY: a plain system call; no buffer is written.
        let n = unsafe {
            libc::recv(
                socket,
                std::ptr::null_mut(),
                0,
                libc::MSG_PEEK | libc::MSG_TRUNC,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Blocks `SIGCHLD` and returns a descriptor that is readable when one is
/// pending (the tool spawner waits on it and its socket together).
pub fn child_signals() -> io::Result<OwnedFd> {
    // SAFETY: a local signal set, filled by the calls that own its format.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        check(libc::sigprocmask(
            libc::SIG_BLOCK,
            &set,
            std::ptr::null_mut(),
        ))?;
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        check(fd)?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Makes the calling process (one thread) a member of the user namespace
/// `userns`, with every capability there.
pub fn join_user_namespace(userns: RawFd) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor the caller holds.
    check(unsafe { libc::setns(userns, libc::CLONE_NEWUSER) })
}

/// Makes the calling process run only when a CPU would otherwise idle.
pub fn idle_priority() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a local parameter for the calling process.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) })
}

/// In a process cloned into a new network namespace: brings its loopback
/// up and returns the namespace, open.
pub fn made_network() -> io::Result<OwnedFd> {
    die_with_parent()?;
    loopback_up()?;
    open_with(
        std::path::Path::new("/proc/self/ns/net"),
        libc::O_RDONLY | libc::O_CLOEXEC,
    )
}

/// Waits for the child `pid` to end: whether it exited 0.
pub fn wait_for(pid: i32) -> bool {
    let mut status = 0;
    loop {
        // SAFETY: waits for a child of this process; status is a local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// In a child of the tool spawner: keeps `fds` as descriptors 3, 4, …
/// (close-on-exec), closes every other descriptor but the standard ones,
/// and makes its standard input its output (`/dev/null`, not the
/// appliance's socket). Returns the numbers they were given.
pub fn keep_only<const N: usize>(fds: [RawFd; N]) -> [RawFd; N] {
    let mut kept = [-1; N];
    // SAFETY: plain system calls on descriptor numbers this process owns;
    // each is moved above every number it could collide with first.
    unsafe {
        libc::dup2(1, 0);
        let above = fds.iter().copied().max().unwrap_or(2).max(2 + N as RawFd) + 1;
        let moved: Vec<RawFd> = fds
            .iter()
            .enumerate()
            .map(|(i, fd)| libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, above + i as RawFd))
            .collect();
        for (i, fd) in moved.iter().enumerate() {
            kept[i] = 3 + i as RawFd;
            libc::dup3(*fd, kept[i], libc::O_CLOEXEC);
        }
        let first = 3 + N as u32;
        if libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) != 0 {
            for other in first as RawFd..1024 {
                libc::close(other);
            }
        }
    }
    kept
}

/// Opens a namespace file (`/proc/self/ns/...`): holding it keeps the
/// namespace alive.
pub fn open_namespace(path: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path; the descriptor is owned on success.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    check(fd)?;
    // SAFETY: just opened, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Closes a descriptor the caller does not own as an `OwnedFd`.
pub fn close(fd: RawFd) {
    // SAFETY: closes a descriptor number; nothing else holds it here.
    unsafe { libc::close(fd) };
}

/// Ends the calling process at once (a child that must not run the
/// parent's exit handlers).
pub fn exit(code: i32) -> ! {
    // SAFETY: _exit runs nothing of the process's and does not return.
    unsafe { libc::_exit(code) }
}

/// Starts `child` in a process that shares this one's memory until it
/// execs or exits, as `vfork` does, on a stack of its own: its pid, once
/// it has. Its exec undoes nothing of this process's memory, which it
/// never copied. `child` runs as a forked child does (see the module's
/// note) and must exec or exit.
pub fn vfork<F: FnOnce()>(child: F) -> io::Result<i32> {
    extern "C" fn run<F: FnOnce()>(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the parent's `Option<F>`, live while the parent
        // is suspended; the child takes it once.
        if let Some(child) = unsafe { &mut *arg.cast::<Option<F>>() }.take() {
            child();
        }
        exit(127)
    }
    /// The child's stack: enough for the steps, which allocate nothing.
    const STACK: usize = 256 * 1024;
    let mut stack: Vec<u8> = Vec::with_capacity(STACK);
    let top = (stack.as_mut_ptr() as usize + STACK) & !15;
    let mut child = Some(child);
    // SAFETY: CLONE_VFORK suspends this process until the child execs or
    // exits, so the child's use of this memory (the stack above and
    // `child`) ends before clone returns here.
    let pid = unsafe {
        libc::clone(
            run::<F>,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut child as *mut Option<F>).cast(),
        )
    };
    drop(stack);
    match pid {
        -1 => Err(io::Error::last_os_error()),
        pid => Ok(pid),
    }
}

/// In the first process of a PID namespace: waits for its child `tool`
/// to end, reaping what else ends meanwhile (the namespace's orphans are
/// its children, so once the tool has ended every process left descends
/// from one of them), then ends every other process of the namespace, if
/// any is left, and reaps them: the tool's wait status once none is left.
pub fn outlive(tool: i32) -> i32 {
    let mut ended = None;
    let mut killed = false;
    loop {
        // Once the tool has ended, a child still running is ended with the
        // rest of the namespace.
        let flags = if ended.is_some() && !killed {
            libc::WNOHANG
        } else {
            0
        };
        let mut status = 0;
        // SAFETY: waits for any child; status is a local.
        let pid = unsafe { libc::waitpid(-1, &mut status, flags) };
        if pid == tool {
            ended = Some(status);
        } else if pid == 0 {
            // SAFETY: in the first process of a PID namespace, -1 is
            // every other process of that namespace, and nothing else.
            unsafe { libc::kill(-1, libc::SIGKILL) };
            killed = true;
        } else if pid < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // No child is left.
            return ended.unwrap_or(libc::SIGKILL);
        }
    }
}

/// Reads what is pending on a signal descriptor.
pub fn drain(fd: RawFd) {
    let mut info = [0u8; 128 * 8];
    // SAFETY: reads into a local buffer of the size given.
    while unsafe { libc::read(fd, info.as_mut_ptr().cast(), info.len()) } > 0 {}
}

/// One ended child, reaped: its pid and wait status; `None` when none is
/// left to reap now.
pub fn reap() -> Option<(i32, i32)> {
    let mut status = 0;
    // SAFETY: waits for any child without blocking; status is a local.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid, status))
}

/// In a child of the tool spawner: no blocked signals, `SIGPIPE` as a
/// program expects it, and `stdin`, `stdout` as its standard input and
/// output (the spawner's socket was its standard input).
pub fn fresh_process(stdin: RawFd, stdout: RawFd) -> io::Result<()> {
    // SAFETY: plain system calls on values and a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        check(libc::sigprocmask(
            libc::SIG_SETMASK,
            &set,
            std::ptr::null_mut(),
        ))?;
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        check(libc::dup2(stdin, 0))?;
        check(libc::dup2(stdout, 1))?;
    }
    Ok(())
}

/// Changes the working directory.
pub fn change_dir(dir: &CStr) -> io::Result<()> {
    // SAFETY: a NUL-terminated path.
    check(unsafe { libc::chdir(dir.as_ptr()) })
}

/// Execs the first of `paths` that can be: returns only why none could
/// (`EACCES` if one was found but not executable, as a shell says).
pub fn exec(
    paths: &[CString],
    argv: &[*const libc::c_char],
    env: &[*const libc::c_char],
) -> io::Error {
    let mut error = libc::ENOENT;
    for path in paths {
        // SAFETY: NUL-terminated strings and null-terminated arrays of
        // them, live across the call.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), env.as_ptr()) };
        match io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOENT)
        {
            libc::ENOENT | libc::ENOTDIR => {}
            libc::EACCES => error = libc::EACCES,
            other => return io::Error::from_raw_os_error(other),
        }
    }
    io::Error::from_raw_os_error(error)
}

/// Writes `error`'s number on `errors` and exits (a child that could not
/// become its tool).
pub fn exit_with(errors: RawFd, error: io::Error) -> ! {
    let errno = error.raw_os_error().unwrap_or(libc::EINVAL).to_ne_bytes();
    // SAFETY: a write of a local buffer, then the exit that runs nothing
    // of the parent's.
    unsafe {
        libc::write(errors, errno.as_ptr().cast(), errno.len());
        libc::_exit(127)
    }
}

/// The listeners a child sent over `from`, `expected` of them.
pub fn receive_listeners(
    from: &OwnedFd,
    expected: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    use std::os::fd::AsRawFd;
    if expected > MAX_LISTENERS {
        return Err(io::Error::other("too many site endpoints"));
    }
    let mut byte = [0u8; 1];
    let (_, fds) = receive_message(from.as_raw_fd(), &mut byte, MAX_LISTENERS)?;
    if fds.len() != expected {
        return Err(io::Error::other(format!(
            "the tool's network sent {} listeners, not {expected}",
            fds.len()
        )));
    }
    Ok(fds.into_iter().map(std::net::TcpListener::from).collect())
}

/// Sends SIGKILL to a process.
pub fn kill(pid: i32) {
    if pid > 0 {
        // SAFETY: a signal to a pid; at worst ESRCH.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Sends SIGKILL to a process group.
pub fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: as kill.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn c_path(path: &std::path::Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with NUL"))
}

/// Mounts a tmpfs of at most `mb` MiB, mode 0700, on `dir`.
pub fn mount_tmpfs(dir: &std::path::Path, mb: u64) -> io::Result<()> {
    let target = c_path(dir)?;
    let options = CString::new(format!("size={mb}m,mode=0700")).expect("no NUL");
    // SAFETY: NUL-terminated strings that outlive the call.
    check(unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        )
    })
}

/// The size of the tmpfs mounted on `dir`, if one is.
pub fn tmpfs_size(dir: &std::path::Path) -> Option<u64> {
    let target = c_path(dir).ok()?;
    // SAFETY: a zeroed statfs is valid and statfs fills it.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(target.as_ptr(), &mut st) != 0 || st.f_type != libc::TMPFS_MAGIC {
            return None;
        }
        Some(st.f_blocks * st.f_bsize as u64)
    }
}

/// Unmounts whatever is mounted on `dir` (nothing when nothing is).
pub fn unmount(dir: &std::path::Path) {
    if let Ok(target) = c_path(dir) {
        // SAFETY: a NUL-terminated path.
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// Makes this process not dumpable: its `/proc` memory, environment and
/// descriptors are closed to other processes of its user (and no core
/// file holds its secrets).
pub fn not_dumpable() {
    // SAFETY: a flag on the calling process.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// The user and group ids of the account `name`.
pub fn account(name: &str) -> Option<(libc::uid_t, libc::gid_t)> {
    let c = CString::new(name).ok()?;
    // SAFETY: getpwnam returns a pointer into static storage or null; it is
    // read at once, before any other call could reuse it.
    unsafe {
        let pw = libc::getpwnam(c.as_ptr());
        (!pw.is_null()).then(|| ((*pw).pw_uid, (*pw).pw_gid))
    }
}

/// A pipe (both ends close-on-exec): the read end and the write end.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just made and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The directory `path`, opened (to change its owner through).
pub fn open_dir(path: &std::path::Path) -> io::Result<OwnedFd> {
    open_with(
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
}

fn open_with(path: &std::path::Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    // SAFETY: a NUL-terminated path; the descriptor is owned once made.
    let fd = unsafe { libc::open(c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The name of the account `uid`, if it has one.
pub fn account_name(uid: libc::uid_t) -> Option<String> {
    // SAFETY: getpwuid returns a pointer into static storage or null; it
    // is read at once.
    unsafe {
        let pw = libc::getpwuid(uid);
        if pw.is_null() {
            return None;
        }
        CStr::from_ptr((*pw).pw_name)
            .to_str()
            .ok()
            .map(str::to_string)
    }
}

/// Gives `path` to a user and group.
pub fn chown(path: &std::path::Path, uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}

#[cfg(test)]
mod tests {
    /// The packaged service lets the appliance confine its tools as this
    /// module does: every namespace [`Namespaces::enter`] makes, the
    /// system calls it and [`become_first_process`] make, and no mask
    /// over `/proc` (with one, the kernel refuses a PID namespace's own
    /// `/proc`, and tools would run beside the appliance's processes).
    #[test]
    fn the_packaged_unit_allows_what_tools_are_confined_with() {
        let unit = include_str!("../../../packaging/debian/agentbay.service");
        let values = |key: &str| -> Vec<String> {
            unit.lines()
                .filter_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(str::to_string)
                .collect()
        };
        let namespaces = values("RestrictNamespaces").join(" ");
        for ns in ["user", "net", "pid", "mnt"] {
            assert!(
                namespaces.split_whitespace().any(|n| n == ns),
                "RestrictNamespaces={namespaces} forbids {ns}"
            );
        }
        let allowed: Vec<String> = values("SystemCallFilter")
            .iter()
            .filter(|v| !v.starts_with('~'))
            .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .collect();
        for call in [
            "unshare",
            "mount",
            "umount2",
            "mount_setattr",
            "pivot_root",
            "setns",
            "setresuid",
            "setresgid",
            "fchownat",
            "capset",
            "landlock_create_ruleset",
            "landlock_add_rule",
            "landlock_restrict_self",
        ] {
            assert!(
                allowed.iter().any(|a| a == call),
                "SystemCallFilter does not allow {call}"
            );
        }
        for mask in ["ProtectKernelTunables", "ProtectKernelLogs"] {
            assert!(
                values(mask).iter().all(|v| v == "false" || v == "no"),
                "{mask} masks part of /proc"
            );
        }
    }
}
