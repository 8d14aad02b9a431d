//! The tool spawner: every tool process is forked by one small
//! single-threaded process, the appliance's own binary started as
//! `agentbay tool-spawner` with the confiner, not by the appliance.
//!
//! A fork copies the forking process's page tables, and in a process with
//! many threads on many CPUs every page it then writes faults and every
//! CPU running one of its threads flushes its TLB. The appliance is large
//! and busy; the spawner is neither. A tool's start costs a fork of a few
//! megabytes (twice with a PID namespace) instead of the appliance's
//! hundreds, and thirty-two tools starting at once no longer stall the
//! appliance's request threads.
//!
//! The appliance prepares everything a start needs (the steps, the world,
//! the descriptors: the tool's standard input and output, its Landlock
//! ruleset, the tools' user namespace, its working directory, the socket
//! its site endpoints come back on) and sends it as one order over a
//! sequenced-packet socket, the descriptors attached. The spawner forks;
//! the child applies the steps and execs; the spawner answers with the pid
//! at once, and later with how the process ended. Whether the exec
//! happened reaches the appliance on a pipe of the order's own (as
//! `std::process` does it), so starts overlap instead of queueing behind
//! each other's setup. The spawner decides nothing and holds no
//! configuration: it starts what an order says, as the appliance's own
//! account. It ends when the appliance's end of its socket closes.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::sys::{self, Steps};

/// The hidden subcommand the spawner runs as.
pub const SUBCOMMAND: &str = "tool-spawner";

static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Names the agentbay binary the spawner runs: `/proc/self/exe` in the
/// appliance's own `main` (the running binary, even once an upgrade has
/// replaced the file); a program that embeds the appliance (a bench)
/// names the built `agentbay`. Unnamed, no tool can start, and the
/// confiner says so: the spawner is never some other program.
pub fn set_program(program: &Path) {
    let _ = PROGRAM.set(program.to_path_buf());
}

/// The largest order, bytes (a world of a few hundred places).
const MAX_ORDER: usize = 256 * 1024;

/// The most descriptors one order carries: the three of every start and
/// those its steps name (a ruleset, a user namespace, a working
/// directory, a socket).
const MAX_FDS: usize = 16;

/// What to start: sent after the order's id (8 bytes, little-endian),
/// with the descriptors `[stdin, stdout, exec errors]` and then those
/// [`Steps::descriptors`] names, in that order.
#[derive(Serialize, Deserialize)]
pub(super) struct Order {
    /// The paths to exec, tried in order: the program, or each directory
    /// of the tool's `PATH` joined with it.
    pub program: Vec<CString>,
    /// Its arguments, its name first.
    pub argv: Vec<CString>,
    /// Its whole environment, `KEY=value`.
    pub env: Vec<CString>,
    /// Where it starts (before its world, if any, moves it).
    pub cwd: CString,
    /// What the child applies to itself before it execs.
    pub steps: Steps,
}

/// The first message the spawner gets: whether it joins the tools' user
/// namespace (its descriptor attached), before any order.
#[derive(Serialize, Deserialize)]
struct Setup {
    join: bool,
}

#[derive(Serialize, Deserialize)]
enum Reply {
    /// The spawner is ready for orders.
    Ready,
    /// An order's child was forked: its pid.
    Started { id: u64, pid: i32 },
    /// An order could not be forked: the error number.
    Refused { id: u64, errno: i32 },
    /// A child ended: its wait status.
    Ended { pid: i32, status: i32 },
}

/// The appliance's side: its link to the spawner, started again if the
/// spawner ended.
pub struct Spawner {
    program: PathBuf,
    /// The tools' user namespace it lives in, if they have one.
    userns: Option<OwnedFd>,
    link: Mutex<Option<Arc<Link>>>,
    next: AtomicU64,
}

struct Link {
    socket: OwnedFd,
    waiting: Mutex<Waiting>,
    alive: AtomicBool,
}

type Status = i32;

/// Where an order's pid goes, or the error number that refused it.
type Pid = oneshot::Sender<Result<i32, i32>>;

#[derive(Default)]
struct Waiting {
    /// Orders sent and not yet answered: where the pid goes, and where the
    /// end goes once there is a pid.
    starts: HashMap<u64, (Pid, oneshot::Sender<Status>)>,
    /// Processes started and not yet ended.
    ends: HashMap<i32, oneshot::Sender<Status>>,
}

/// A started tool process: its pid (the leader of its process group), its
/// standard input and output, and how it ends.
pub struct Tool {
    /// Its pid.
    pub pid: u32,
    /// Its standard input.
    pub stdin: tokio::net::unix::pipe::Sender,
    /// Its standard output.
    pub stdout: tokio::net::unix::pipe::Receiver,
    ended: oneshot::Receiver<Status>,
}

impl Tool {
    /// How it ended.
    pub async fn wait(self) -> io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        self.ended
            .await
            .map(std::process::ExitStatus::from_raw)
            .map_err(|_| io::Error::other("the tool spawner ended before the tool"))
    }
}

impl Spawner {
    /// Starts the spawner from the program [`set_program`] named, in the
    /// tools' user namespace `userns` if there is one (an unprivileged
    /// appliance's subordinate range): ready when this returns, or why
    /// not.
    pub fn start(userns: Option<OwnedFd>) -> Result<Spawner, String> {
        let program = PROGRAM.get().ok_or(
            "the tool spawner's program is not named (runtime::confine::spawner::set_program)",
        )?;
        let link = Link::start(program, userns.as_ref())?;
        Ok(Spawner {
            program: program.clone(),
            userns,
            link: Mutex::new(Some(link)),
            next: AtomicU64::new(1),
        })
    }

    /// The live link, or a new spawner's if the last one ended.
    fn link(&self) -> Result<Arc<Link>, String> {
        let mut link = self.link.lock();
        if let Some(l) = link.as_ref().filter(|l| l.alive.load(Ordering::Acquire)) {
            return Ok(l.clone());
        }
        let l = Link::start(&self.program, self.userns.as_ref())?;
        *link = Some(l.clone());
        Ok(l)
    }

    /// Starts `order` with `fds` (the descriptors its steps name, in
    /// order): returns once the tool has exec'd, or why it did not.
    pub(super) async fn spawn(&self, order: &Order, fds: &[RawFd]) -> Result<Tool, String> {
        let (stdin_r, stdin_w) = sys::pipe().map_err(|e| format!("no pipe: {e}"))?;
        let (stdout_r, stdout_w) = sys::pipe().map_err(|e| format!("no pipe: {e}"))?;
        let (errors_r, errors_w) = sys::pipe().map_err(|e| format!("no pipe: {e}"))?;
        if fds.len() + 3 > MAX_FDS {
            return Err("the tool's start needs too many descriptors".into());
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut message = id.to_le_bytes().to_vec();
        rmp_serde::encode::write(&mut message, order).map_err(|e| e.to_string())?;
        if message.len() > MAX_ORDER {
            return Err(format!(
                "the tool's start is {} bytes, more than the spawner takes ({MAX_ORDER})",
                message.len()
            ));
        }
        let mut all = vec![
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            errors_w.as_raw_fd(),
        ];
        all.extend_from_slice(fds);
        let link = self.link()?;
        let (started_tx, started) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        {
            let mut waiting = link.waiting.lock();
            if !link.alive.load(Ordering::Acquire) {
                return Err("the tool spawner ended".into());
            }
            waiting.starts.insert(id, (started_tx, ended_tx));
        }
        if let Err(e) = sys::send_message(link.socket.as_raw_fd(), &message, &all) {
            link.waiting.lock().starts.remove(&id);
            return Err(format!("the tool spawner cannot be reached: {e}"));
        }
        // The spawner has its own copies now; the tool's ends close here
        // so that its output ends when it does.
        drop((stdin_r, stdout_w, errors_w));
        let pid = match started.await {
            Ok(Ok(pid)) => pid,
            Ok(Err(errno)) => return Err(io::Error::from_raw_os_error(errno).to_string()),
            Err(_) => return Err("the tool spawner ended".into()),
        };
        // Until it is handed over, a start that fails or is dropped kills
        // what it started.
        let unclaimed = Unclaimed(pid);
        // The child writes the error number here if it cannot exec; the
        // pipe closes without a word when it does.
        let mut errors =
            tokio::net::unix::pipe::Receiver::from_owned_fd(errors_r).map_err(|e| e.to_string())?;
        let mut word = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut errors, &mut word)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(errno) = word.first_chunk::<4>() {
            // It has exited already.
            unclaimed.claim();
            return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(*errno)).to_string());
        }
        let stdin =
            tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w).map_err(|e| e.to_string())?;
        let stdout =
            tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(|e| e.to_string())?;
        Ok(Tool {
            pid: unclaimed.claim() as u32,
            stdin,
            stdout,
            ended,
        })
    }
}

/// A started process nobody holds yet: killed when dropped.
struct Unclaimed(i32);

impl Unclaimed {
    /// Its pid, now held by someone else.
    fn claim(self) -> i32 {
        let pid = self.0;
        std::mem::forget(self);
        pid
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        sys::kill(self.0);
    }
}

impl Link {
    fn start(program: &Path, userns: Option<&OwnedFd>) -> Result<Arc<Link>, String> {
        let fail = |e: io::Error| {
            format!(
                "the tool spawner ({} {SUBCOMMAND}) cannot start: {e}",
                program.display()
            )
        };
        let (ours, theirs) = sys::socket_pair(libc::SOCK_SEQPACKET).map_err(fail)?;
        // Its standard input is its socket; it inherits the appliance's
        // standard error, which its tools write to. No environment.
        let mut child = std::process::Command::new(program)
            .arg(SUBCOMMAND)
            .env_clear()
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map_err(fail)?;
        let setup = rmp_serde::to_vec(&Setup {
            join: userns.is_some(),
        })
        .map_err(io::Error::other);
        let ready = setup
            .and_then(|setup| {
                let fds: Vec<RawFd> = userns.iter().map(|fd| fd.as_raw_fd()).collect();
                sys::send_message(ours.as_raw_fd(), &setup, &fds)
            })
            .and_then(|()| wait_readable(ours.as_raw_fd(), 10_000))
            .and_then(|()| {
                let mut buf = [0u8; 64];
                let (n, _) = sys::receive_message(ours.as_raw_fd(), &mut buf, 0)?;
                match rmp_serde::from_slice::<Reply>(&buf[..n]) {
                    Ok(Reply::Ready) => Ok(()),
                    _ => Err(io::Error::other("it did not say it was ready")),
                }
            });
        if let Err(e) = ready {
            let _ = child.kill();
            let _ = child.wait();
            return Err(fail(e));
        }
        let link = Arc::new(Link {
            socket: ours,
            waiting: Mutex::new(Waiting::default()),
            alive: AtomicBool::new(true),
        });
        let reader = link.clone();
        std::thread::Builder::new()
            .name("tool-spawner".into())
            .spawn(move || reader.read(child))
            .map_err(fail)?;
        Ok(link)
    }

    /// Reads the spawner's answers until it ends, handing each to whoever
    /// waits for it.
    fn read(&self, mut child: std::process::Child) {
        let mut buf = [0u8; 256];
        while let Ok((n, _)) = sys::receive_message(self.socket.as_raw_fd(), &mut buf, 0) {
            if n == 0 {
                break;
            }
            let mut waiting = self.waiting.lock();
            match rmp_serde::from_slice::<Reply>(&buf[..n]) {
                Ok(Reply::Started { id, pid }) => {
                    if let Some((started, ended)) = waiting.starts.remove(&id) {
                        waiting.ends.insert(pid, ended);
                        if started.send(Ok(pid)).is_err() {
                            // Nobody waits for it any more (the call that
                            // started it was dropped): it must not run.
                            sys::kill(pid);
                        }
                    }
                }
                Ok(Reply::Refused { id, errno }) => {
                    if let Some((started, _)) = waiting.starts.remove(&id) {
                        let _ = started.send(Err(errno));
                    }
                }
                Ok(Reply::Ended { pid, status }) => {
                    if let Some(ended) = waiting.ends.remove(&pid) {
                        let _ = ended.send(status);
                    }
                }
                Ok(Reply::Ready) | Err(_) => {}
            }
        }
        {
            let mut waiting = self.waiting.lock();
            self.alive.store(false, Ordering::Release);
            waiting.starts.clear();
            waiting.ends.clear();
        }
        let _ = child.kill();
        let status = child.wait();
        tracing::warn!(
            status = ?status,
            "the tool spawner ended; the next tool starts a new one"
        );
    }
}

/// Waits up to `ms` for `fd` to be readable.
fn wait_readable(fd: RawFd, ms: i32) -> io::Result<()> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, live for the call.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        1 => Ok(()),
        0 => Err(io::Error::from(io::ErrorKind::TimedOut)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The spawner itself (`agentbay tool-spawner`): serves orders on its
/// standard input until the appliance closes it.
pub fn serve() -> std::process::ExitCode {
    const SOCKET: RawFd = 0;
    sys::not_dumpable();
    // Compiled once, before any fork: a child only installs it.
    let _ = super::filter::programs();
    let children = match sys::child_signals() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("tool spawner: no signal descriptor: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut buf = vec![0u8; MAX_ORDER];
    if let Err(e) = set_up(SOCKET, &mut buf) {
        eprintln!("tool spawner: {e}");
        return std::process::ExitCode::FAILURE;
    }
    if send(SOCKET, &Reply::Ready).is_err() {
        return std::process::ExitCode::FAILURE;
    }
    let mut pool = Pool::start();
    loop {
        pool.ask();
        let mut polls = [
            libc::pollfd {
                fd: SOCKET,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: children.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pool.maker.as_ref().map_or(-1, |m| m.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: three pollfds, live for the call (a negative descriptor
        // is skipped).
        if unsafe { libc::poll(polls.as_mut_ptr(), 3, -1) } < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return std::process::ExitCode::FAILURE;
        }
        if polls[2].revents != 0 {
            pool.receive();
        }
        if polls[1].revents != 0 {
            sys::drain(children.as_raw_fd());
            while let Some((pid, status)) = sys::reap() {
                if send(SOCKET, &Reply::Ended { pid, status }).is_err() {
                    return std::process::ExitCode::SUCCESS;
                }
            }
        }
        if polls[0].revents & libc::POLLIN != 0 {
            match sys::receive_message(SOCKET, &mut buf, MAX_FDS) {
                Ok((0, _)) => return std::process::ExitCode::SUCCESS,
                Ok((n, fds)) => {
                    let reply = start(&buf[..n], fds, &mut pool);
                    if send(SOCKET, &reply).is_err() {
                        return std::process::ExitCode::SUCCESS;
                    }
                }
                // A message too large or with too many descriptors is
                // refused whole (its id came first).
                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                    let id = u64::from_le_bytes(*buf.first_chunk::<8>().expect("8 bytes"));
                    let reply = Reply::Refused {
                        id,
                        errno: libc::EMSGSIZE,
                    };
                    if send(SOCKET, &reply).is_err() {
                        return std::process::ExitCode::SUCCESS;
                    }
                }
                Err(_) => return std::process::ExitCode::SUCCESS,
            }
        } else if polls[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return std::process::ExitCode::SUCCESS;
        }
    }
}

/// How many network namespaces the spawner keeps made ahead: a burst of
/// this many tools starts without making one.
const POOL: usize = 32;

/// Network namespaces made ahead, each with its loopback up, handed to
/// one tool each and never again. Making one takes a kernel-wide lock and
/// about half a millisecond of CPU; the maker, a child of the spawner,
/// makes them at idle priority (only when a CPU would otherwise idle), so
/// a burst of starts finds them made. Where the spawner cannot make a
/// network namespace itself (an unprivileged appliance without a
/// subordinate range: each tool makes its own user namespace), there is
/// no pool and each tool makes its own.
struct Pool {
    /// The maker's socket: a byte asks for one namespace, which comes
    /// back as a descriptor.
    maker: Option<OwnedFd>,
    ready: Vec<OwnedFd>,
    asked: usize,
}

impl Pool {
    fn start() -> Pool {
        let maker = sys::socket_pair(libc::SOCK_SEQPACKET)
            .ok()
            .and_then(|(ours, theirs)| {
                // SAFETY: this process has one thread; the child runs `make`,
                // which exits.
                match unsafe { libc::fork() } {
                    0 => {
                        // The maker holds nothing of the spawner's: not the
                        // appliance's socket, not the pool's other end.
                        drop(ours);
                        sys::close(0);
                        make(theirs)
                    }
                    -1 => None,
                    _ => Some(ours),
                }
            });
        Pool {
            maker,
            ready: Vec::new(),
            asked: 0,
        }
    }

    /// Asks the maker for what the pool lacks.
    fn ask(&mut self) {
        let Some(maker) = &self.maker else { return };
        let want = POOL.saturating_sub(self.ready.len() + self.asked);
        for _ in 0..want {
            if sys::send_message(maker.as_raw_fd(), b"?", &[]).is_err() {
                self.maker = None;
                return;
            }
            self.asked += 1;
        }
    }

    /// Takes what the maker sent: a namespace, or word that it cannot
    /// make them here (the pool ends).
    fn receive(&mut self) {
        let Some(maker) = &self.maker else { return };
        let mut word = [0u8; 1];
        match sys::receive_message(maker.as_raw_fd(), &mut word, 1) {
            Ok((1, mut fds)) if fds.len() == 1 => {
                self.asked = self.asked.saturating_sub(1);
                self.ready.extend(fds.pop());
            }
            _ => {
                self.maker = None;
                self.asked = 0;
            }
        }
    }

    /// A namespace made ahead, if one is ready.
    fn take(&mut self) -> Option<OwnedFd> {
        self.ready.pop()
    }
}

/// The maker: for each byte asked, a child cloned into a new network
/// namespace brings its loopback up and sends the namespace back. Ends
/// with the spawner (its socket closes, or it dies).
fn make(socket: OwnedFd) -> ! {
    let _ = sys::idle_priority();
    let _ = sys::die_with_parent();
    let fd = socket.as_raw_fd();
    let mut byte = [0u8; 1];
    loop {
        match sys::receive_message(fd, &mut byte, 0) {
            Ok((1, _)) => {}
            _ => sys::exit(0),
        }
        let flags = (libc::CLONE_NEWNET | libc::SIGCHLD) as libc::c_ulong;
        // SAFETY: this process has one thread; the child sends its
        // namespace and exits.
        match unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) }
            as i32
        {
            0 => {
                let sent = sys::made_network()
                    .and_then(|net| sys::send_message(fd, b"n", &[net.as_raw_fd()]));
                sys::exit(i32::from(sent.is_err()))
            }
            -1 => {
                let _ = sys::send_message(fd, b"x", &[]);
                sys::exit(0)
            }
            child => {
                if !sys::wait_for(child) {
                    // It could not: the pool ends.
                    let _ = sys::send_message(fd, b"x", &[]);
                    sys::exit(0)
                }
            }
        }
    }
}

/// Reads the setup and joins the tools' user namespace if it says so: the
/// spawner is then root there, and makes each tool's other namespaces
/// with the tool itself.
fn set_up(socket: RawFd, buf: &mut [u8]) -> io::Result<()> {
    let (n, fds) = sys::receive_message(socket, buf, 1)?;
    let setup: Setup = rmp_serde::from_slice(&buf[..n]).map_err(io::Error::other)?;
    match (setup.join, fds.first()) {
        (false, _) => Ok(()),
        (true, Some(userns)) => sys::join_user_namespace(userns.as_raw_fd()),
        (true, None) => Err(io::Error::other("no user namespace to join")),
    }
}

fn send(socket: RawFd, reply: &Reply) -> io::Result<()> {
    let message = rmp_serde::to_vec(reply).map_err(io::Error::other)?;
    sys::send_message(socket, &message, &[])
}

/// Forks the child of one order: the answer to send.
fn start(message: &[u8], fds: Vec<OwnedFd>, pool: &mut Pool) -> Reply {
    let Some((id, order)) = message.split_first_chunk::<8>() else {
        return Reply::Refused {
            id: 0,
            errno: libc::EINVAL,
        };
    };
    let id = u64::from_le_bytes(*id);
    let refused = |errno| Reply::Refused { id, errno };
    let Ok(mut order) = rmp_serde::from_slice::<Order>(order) else {
        return refused(libc::EINVAL);
    };
    let [stdin, stdout, errors, rest @ ..] = &fds[..] else {
        return refused(libc::EINVAL);
    };
    let mut named = order.steps.descriptors();
    if named.len() != rest.len() {
        return refused(libc::EINVAL);
    }
    for (fd, got) in named.iter_mut().zip(rest) {
        **fd = got.as_raw_fd();
    }
    drop(named);
    // A tool of the tools' own user namespace (or root's) joins a network
    // made ahead; one that makes a user namespace of its own could not.
    let mut network = None;
    if let Some(ns) = order.steps.namespaces.as_mut()
        && ns.network
        && ns.user_maps.is_none()
    {
        network = pool.take();
        ns.network_from = network.as_ref().map(|n| n.as_raw_fd());
    }
    let argv = pointers(&order.argv);
    let env = pointers(&order.env);
    let io = [stdin.as_raw_fd(), stdout.as_raw_fd(), errors.as_raw_fd()];
    // Forked with its namespaces, as `fork` would but without the C
    // library's fork handlers (this process has one thread, so no lock is
    // held); the child runs `become_tool`, which execs or exits.
    // SAFETY: clone without a new stack returns twice, as fork does.
    let flags = order.steps.clone_flags() as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    match unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) } as i32 {
        -1 => refused(
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EAGAIN),
        ),
        0 => become_tool(&order, &argv, &env, io),
        pid => {
            drop(network);
            Reply::Started { id, pid }
        }
    }
}

/// A null-terminated array of pointers to `strings`.
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The forked child: takes its standard input and output, applies its
/// steps and execs, or writes why not on the errors pipe and exits.
fn become_tool(
    order: &Order,
    argv: &[*const libc::c_char],
    env: &[*const libc::c_char],
    [stdin, stdout, errors]: [RawFd; 3],
) -> ! {
    let prepared = sys::fresh_process(stdin, stdout)
        .and_then(|()| sys::change_dir(&order.cwd))
        .and_then(|()| order.steps.apply_cloned());
    let error = match prepared {
        Err(e) => e,
        Ok(()) => sys::exec(&order.program, argv, env),
    };
    sys::exit_with(errors, error)
}
