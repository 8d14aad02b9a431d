//! What a confined process does to itself between fork and exec, and the
//! few calls the parent makes on it. Between fork and exec only
//! async-signal-safe calls are allowed (the appliance is multi-threaded):
//! every step here is one system call on buffers prepared before the
//! fork, and nothing allocates.

use std::ffi::{CStr, CString};
use std::io;

/// Everything the child applies to itself, prepared in the parent.
#[derive(Clone, Debug, Default)]
pub struct Steps {
    /// `cgroup.procs` files to write `0` (itself) into.
    pub join: Vec<CString>,
    /// `RLIMIT_AS`, bytes (the weaker mechanism's memory bound).
    pub address_space: Option<u64>,
    /// `RLIMIT_NPROC` (the weaker mechanism's process bound).
    pub processes: Option<u64>,
    /// A network namespace of its own with only loopback: as root one
    /// namespace; otherwise also a user namespace that maps the caller's
    /// own ids (`uid_map` and `gid_map` contents prepared here).
    pub isolate_network: Option<Isolation>,
    /// The user and group to become (the appliance runs as root; its
    /// tools do not).
    pub user: Option<(libc::uid_t, libc::gid_t)>,
    /// A Landlock ruleset to restrict itself with (its file descriptor).
    pub landlock: Option<i32>,
}

/// How a process leaves the host's network.
#[derive(Clone, Debug)]
pub struct Isolation {
    /// `Some((uid_map, gid_map))` when a user namespace is needed too.
    pub user_maps: Option<(CString, CString)>,
}

impl Isolation {
    /// The isolation this process can make: a user namespace too unless
    /// it is root.
    pub fn for_this_process() -> Isolation {
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Isolation {
            user_maps: (uid != 0).then(|| {
                (
                    CString::new(format!("{uid} {uid} 1\n")).expect("no NUL"),
                    CString::new(format!("{gid} {gid} 1\n")).expect("no NUL"),
                )
            }),
        }
    }
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

impl Steps {
    /// Applies the steps to the calling process. Runs between fork and
    /// exec: see the module's note.
    pub fn apply(&self) -> io::Result<()> {
        for procs in &self.join {
            write_file(procs, b"0")?;
        }
        // SAFETY: plain system calls on values.
        unsafe {
            check(libc::setsid())?;
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
        if let Some(isolation) = &self.isolate_network {
            match &isolation.user_maps {
                None => check(unsafe { libc::unshare(libc::CLONE_NEWNET) })?,
                Some((uid_map, gid_map)) => {
                    check(unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) })?;
                    write_file(SETGROUPS, b"deny")?;
                    write_file(UID_MAP, uid_map.as_bytes())?;
                    write_file(GID_MAP, gid_map.as_bytes())?;
                }
            }
            loopback_up()?;
        }
        if let Some((uid, gid)) = self.user {
            // SAFETY: plain system calls on values.
            unsafe {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setgid(gid))?;
                check(libc::setuid(uid))?;
            }
        }
        if let Some(fd) = self.landlock {
            // SAFETY: plain system calls; fd is the parent's ruleset,
            // inherited across fork.
            unsafe {
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
                check(libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) as libc::c_int)?;
            }
        }
        Ok(())
    }
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

/// A TCP listener on `127.0.0.1:port` inside the network namespace of
/// process `pid`, made from a thread that enters that namespace for the
/// moment of the bind (a socket keeps the namespace it was made in) and
/// comes back.
pub fn listen_in_netns_of(pid: u32, port: u16) -> io::Result<std::net::TcpListener> {
    use std::os::fd::AsRawFd;
    std::thread::scope(|s| {
        s.spawn(|| {
            let own = std::fs::File::open("/proc/thread-self/ns/net")?;
            let target = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
            // SAFETY: setns on open namespace files; this thread only.
            check(unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) })?;
            let bound = std::net::TcpListener::bind(("127.0.0.1", port));
            // SAFETY: as above, back to where the thread was.
            // (A thread that cannot go back ends here, and its namespace
            // with it.)
            check(unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET) })?;
            bound
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread failed")))
    })
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

/// Gives `path` to a user and group.
pub fn chown(path: &std::path::Path, uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}
