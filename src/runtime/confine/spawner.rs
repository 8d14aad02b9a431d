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
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::cgroup::{Group, Root};
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
    /// An order's child was forked: its pid, the name of the group the
    /// spawner made for it, and whether that process is the first of the
    /// tool's PID namespace, which starts the tool and stays after it
    /// (holding nothing of it) until the group is removed.
    Started {
        id: u64,
        pid: i32,
        group: Option<String>,
        first: bool,
    },
    /// An order could not be forked: the error number.
    Refused { id: u64, errno: i32 },
    /// A child ended: its wait status.
    Ended { pid: i32, status: i32 },
}

/// The appliance's side: its link to the spawner, started again if the
/// spawner ended.
pub struct Spawner {
    program: PathBuf,
    /// Where the groups it makes are.
    cgroup: Option<Root>,
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

/// Where an order's pid, group and whether it is the first process of
/// the tool's namespace go, or the error number that refused it.
type Pid = oneshot::Sender<Result<(i32, Option<String>, bool), i32>>;

#[derive(Default)]
struct Waiting {
    /// Orders sent and not yet answered: where the pid goes, and where the
    /// end goes once there is a pid.
    starts: HashMap<u64, (Pid, Ended)>,
    /// Processes started and not yet ended.
    ends: HashMap<i32, Ended>,
}

/// Where a tool's end goes, and the flag it sets first.
type Ended = (oneshot::Sender<Status>, Arc<AtomicBool>);

/// A started tool process: its pid (the leader of its process group), its
/// standard input and output, and how it ends.
pub struct Tool {
    /// Its pid.
    pub pid: u32,
    /// The group the spawner made for it, if its steps have one.
    pub group: Option<Group>,
    /// Whether `pid` is the first process of the tool's PID namespace,
    /// which started the tool and stays after it, alone in the group,
    /// until the group is removed.
    pub first: bool,
    /// Set once the spawner said the tool ended.
    pub over: Arc<AtomicBool>,
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
    pub fn start(userns: Option<OwnedFd>, cgroup: Option<Root>) -> Result<Spawner, String> {
        let program = PROGRAM.get().ok_or(
            "the tool spawner's program is not named (runtime::confine::spawner::set_program)",
        )?;
        let link = Link::start(program, userns.as_ref(), cgroup.clone())?;
        Ok(Spawner {
            program: program.clone(),
            cgroup,
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
        let l = Link::start(&self.program, self.userns.as_ref(), self.cgroup.clone())?;
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
        let over = Arc::new(AtomicBool::new(false));
        {
            let mut waiting = link.waiting.lock();
            if !link.alive.load(Ordering::Acquire) {
                return Err("the tool spawner ended".into());
            }
            waiting
                .starts
                .insert(id, (started_tx, (ended_tx, over.clone())));
        }
        if let Err(e) = sys::send_message(link.socket.as_raw_fd(), &message, &all) {
            link.waiting.lock().starts.remove(&id);
            return Err(format!("the tool spawner cannot be reached: {e}"));
        }
        // The spawner has its own copies now; the tool's ends close here
        // so that its output ends when it does.
        drop((stdin_r, stdout_w, errors_w));
        let (pid, group, first) = match started.await {
            Ok(Ok(started)) => started,
            Ok(Err(errno)) => return Err(io::Error::from_raw_os_error(errno).to_string()),
            Err(_) => return Err("the tool spawner ended".into()),
        };
        // Until it is handed over, a start that fails or is dropped kills
        // what it started and removes its group.
        let mut unclaimed = Unclaimed {
            pid,
            group: group.and_then(|name| Some((self.cgroup.clone()?, name))),
        };
        // The child writes the error number here if it cannot exec; the
        // pipe closes without a word when it does.
        let mut errors =
            tokio::net::unix::pipe::Receiver::from_owned_fd(errors_r).map_err(|e| e.to_string())?;
        let mut word = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut errors, &mut word)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(errno) = word.first_chunk::<4>() {
            // It has exited already: only its group is left.
            let group = unclaimed.group.take();
            unclaimed.claim();
            if let Some((root, name)) = group {
                std::thread::spawn(move || root.group(&name).remove());
            }
            return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(*errno)).to_string());
        }
        let stdin =
            tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w).map_err(|e| e.to_string())?;
        let stdout =
            tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(|e| e.to_string())?;
        // It made its group before it exec'd.
        let group = unclaimed.group.take().map(|(root, name)| root.group(&name));
        Ok(Tool {
            pid: unclaimed.claim() as u32,
            group,
            first,
            over,
            stdin,
            stdout,
            ended,
        })
    }
}

/// A started process nobody holds yet, and its group (where, and its
/// name): killed and removed when dropped.
struct Unclaimed {
    pid: i32,
    group: Option<(Root, String)>,
}

impl Unclaimed {
    /// Its pid, now held by someone else.
    fn claim(mut self) -> i32 {
        let pid = self.pid;
        self.pid = 0;
        pid
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if self.pid > 0 {
            sys::kill(self.pid);
        }
        if let Some((root, name)) = self.group.take() {
            // Once it is gone (its group is busy until then).
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                root.group(&name).remove();
            });
        }
    }
}

impl Link {
    fn start(
        program: &Path,
        userns: Option<&OwnedFd>,
        cgroup: Option<Root>,
    ) -> Result<Arc<Link>, String> {
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
            .spawn(move || reader.read(child, cgroup))
            .map_err(fail)?;
        Ok(link)
    }

    /// Reads the spawner's answers until it ends, handing each to whoever
    /// waits for it; then removes the groups of the processes it made
    /// ahead, which ended with it (a spawner that ends on its own removes
    /// them itself; one that was killed could not). A started tool's group
    /// is its cage's to remove.
    fn read(&self, mut child: std::process::Child, cgroup: Option<Root>) {
        let mut buf = [0u8; 256];
        while let Ok((n, _)) = sys::receive_message(self.socket.as_raw_fd(), &mut buf, 0) {
            if n == 0 {
                break;
            }
            let mut waiting = self.waiting.lock();
            match rmp_serde::from_slice::<Reply>(&buf[..n]) {
                Ok(Reply::Started {
                    id,
                    pid,
                    group,
                    first,
                }) => {
                    if let Some((started, ended)) = waiting.starts.remove(&id) {
                        waiting.ends.insert(pid, ended);
                        if started.send(Ok((pid, group, first))).is_err() {
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
                    if let Some((ended, over)) = waiting.ends.remove(&pid) {
                        over.store(true, Ordering::Release);
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
        if let Some(root) = cgroup {
            root.remove_empty(&format!("tool-{}-", child.id()));
        }
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
    let mut spawner = Serving {
        networks: Pool::start(),
        blanks: Blanks::default(),
        started: HashMap::new(),
        firsts: Vec::new(),
        reported: std::collections::HashSet::new(),
        lingering: Vec::new(),
        groups: 0,
        trees: sys::can_copy_trees(),
    };
    let code = spawner.run(&children, &mut buf);
    spawner.end();
    code
}

/// The spawner's socket to the appliance: its standard input.
const SOCKET: RawFd = 0;

fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// The spawner's state.
struct Serving {
    networks: Pool,
    blanks: Blanks,
    /// Each process started and not yet ended, with the namespaces it
    /// was given (the spawner's hold on them): when it ends they go to
    /// the maker, which lets go of them at idle priority, so that taking
    /// them apart (its mounts, its network) is not done when the process
    /// exits, while other tools start. With each, its group (removed with
    /// it if the spawner ends first).
    started: HashMap<i32, (Vec<OwnedFd>, Option<sys::Cgroup>)>,
    /// The sockets of processes made ahead that were handed an order:
    /// one that is the first of its tool's PID namespace says there how
    /// its tool ended ([`first_of_namespace`]).
    firsts: Vec<(i32, OwnedFd)>,
    /// Those whose tool's end the appliance was told already.
    reported: std::collections::HashSet<i32>,
    /// The sockets of first processes whose tool ended: closed at a quiet
    /// moment, when each ends (what the kernel undoes of it then is not
    /// done while other tools start).
    lingering: Vec<OwnedFd>,
    /// Groups named so far.
    groups: u64,
    /// Whether it can copy trees of its mount namespace: a tool then
    /// pivots into its world before its order comes, and what its order
    /// binds comes as trees ([`sys::World::bind_as_trees`]).
    trees: bool,
}

/// An order, read: its id, the order, the tool's standard input and
/// output and exec-error pipe, and the descriptors its steps name (the
/// steps hold their numbers).
struct Received {
    id: u64,
    order: Order,
    io: [OwnedFd; 3],
    /// The descriptors its steps name, open while the steps hold their
    /// numbers.
    _named: Vec<OwnedFd>,
}

impl Received {
    /// Reads an order: its id and the order, or the error number that
    /// refuses it (with its id, 0 if it has none).
    fn read(message: &[u8], fds: Vec<OwnedFd>) -> Result<Received, (u64, i32)> {
        let Some((id, order)) = message.split_first_chunk::<8>() else {
            return Err((0, libc::EINVAL));
        };
        let id = u64::from_le_bytes(*id);
        let Ok(mut order) = rmp_serde::from_slice::<Order>(order) else {
            return Err((id, libc::EINVAL));
        };
        let mut fds = fds.into_iter();
        let (Some(stdin), Some(stdout), Some(errors)) = (fds.next(), fds.next(), fds.next()) else {
            return Err((id, libc::EINVAL));
        };
        let named: Vec<OwnedFd> = fds.collect();
        let mut numbers = order.steps.descriptors();
        if numbers.len() != named.len() {
            return Err((id, libc::EINVAL));
        }
        for (number, fd) in numbers.iter_mut().zip(&named) {
            **number = fd.as_raw_fd();
        }
        drop(numbers);
        Ok(Received {
            id,
            order,
            io: [stdin, stdout, errors],
            _named: named,
        })
    }

    /// Becomes the tool: takes its standard input and output and its
    /// working directory, applies the rest of its steps (`ahead`: all of
    /// them, not only those a process made ahead left) and execs, or
    /// writes why not on the errors pipe and exits.
    fn become_tool(&self, ahead: bool) -> ! {
        let argv = pointers(&self.order.argv);
        let env = pointers(&self.order.env);
        self.exec_as_tool(ahead, &argv, &env)
    }

    /// [`Received::become_tool`] with the order's arguments and
    /// environment as the pointers exec takes.
    fn exec_as_tool(
        &self,
        ahead: bool,
        argv: &[*const libc::c_char],
        env: &[*const libc::c_char],
    ) -> ! {
        let order = &self.order;
        let [stdin, stdout, errors] = &self.io;
        let prepared = sys::fresh_process(stdin.as_raw_fd(), stdout.as_raw_fd())
            .and_then(|()| {
                if ahead {
                    order.steps.apply_ahead(true)
                } else {
                    Ok(())
                }
            })
            .and_then(|()| sys::change_dir(&order.cwd))
            .and_then(|()| order.steps.apply_rest());
        let error = match prepared {
            Err(e) => e,
            Ok(()) => sys::exec(&order.program, argv, env),
        };
        sys::exit_with(errors.as_raw_fd(), error)
    }
}

impl Serving {
    /// Serves the appliance's orders until it ends (its socket closes):
    /// how the spawner ends.
    fn run(&mut self, children: &OwnedFd, buf: &mut [u8]) -> std::process::ExitCode {
        loop {
            self.networks.ask();
            let wait = match (self.blanks.wait(), self.lingering.is_empty()) {
                (wait, true) => wait,
                (-1, false) => QUIET.as_millis() as libc::c_int,
                (wait, false) => wait.min(QUIET.as_millis() as libc::c_int),
            };
            let mut polls = vec![
                pollfd(SOCKET),
                pollfd(children.as_raw_fd()),
                pollfd(self.networks.maker.as_ref().map_or(-1, |m| m.as_raw_fd())),
            ];
            polls.extend(
                self.blanks
                    .making
                    .iter()
                    .map(|b| pollfd(b.socket.as_raw_fd())),
            );
            let firsts = 3 + self.blanks.making.len();
            polls.extend(self.firsts.iter().map(|(_, s)| pollfd(s.as_raw_fd())));
            // SAFETY: pollfds live for the call (a negative descriptor is
            // skipped).
            let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return std::process::ExitCode::FAILURE;
            }
            if n == 0 {
                if self.blanks.quiet() {
                    self.lingering.clear();
                }
                self.make_blank();
                continue;
            }
            if polls[2].revents != 0 {
                self.networks.receive();
            }
            // Tools that ended, said by the first process of their
            // namespace.
            for (i, p) in polls[firsts..].iter().enumerate().rev() {
                if p.revents != 0 && self.heard_first(i).is_err() {
                    return std::process::ExitCode::SUCCESS;
                }
            }
            // Blanks that said they are ready (or ended: reaped below).
            for (i, p) in polls[3..firsts].iter().enumerate().rev() {
                if p.revents != 0 {
                    self.blanks.hear(i);
                }
            }
            if polls[1].revents != 0 {
                sys::drain(children.as_raw_fd());
                while let Some((pid, status)) = sys::reap() {
                    if self.reaped(pid, status).is_err() {
                        return std::process::ExitCode::SUCCESS;
                    }
                }
            }
            if polls[0].revents & libc::POLLIN != 0 {
                let reply = match sys::receive_message(SOCKET, buf, MAX_FDS) {
                    Ok((0, _)) => return std::process::ExitCode::SUCCESS,
                    Ok((n, fds)) => self.start(&buf[..n], fds),
                    // A message too large or with too many descriptors is
                    // refused whole (its id came first).
                    Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Reply::Refused {
                        id: u64::from_le_bytes(*buf.first_chunk::<8>().expect("8 bytes")),
                        errno: libc::EMSGSIZE,
                    },
                    Err(_) => return std::process::ExitCode::SUCCESS,
                };
                if send(SOCKET, &reply).is_err() {
                    return std::process::ExitCode::SUCCESS;
                }
            } else if polls[0].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                return std::process::ExitCode::SUCCESS;
            }
        }
    }

    /// Ends with the appliance: kills every process it started or made
    /// ahead, waits for each and removes the group it named for it, so
    /// that a stop (or a killed appliance) leaves no group behind. A
    /// group something else still holds stays for the next start, which
    /// removes what an earlier one left.
    fn end(&mut self) {
        let mut ending: Vec<(i32, Option<sys::Cgroup>)> = self
            .started
            .drain()
            .map(|(pid, (_, group))| (pid, group))
            .collect();
        ending.extend(
            self.blanks
                .making
                .drain(..)
                .chain(self.blanks.ready.drain(..))
                .map(|b| (b.pid, b.steps.cgroup)),
        );
        ending.extend(
            self.blanks
                .discarded
                .drain()
                .map(|(pid, steps)| (pid, steps.cgroup)),
        );
        for (pid, _) in &ending {
            sys::kill(*pid);
        }
        for (pid, group) in &mut ending {
            sys::wait_for(*pid);
            if let Some(group) = group {
                group.remove();
            }
        }
    }

    /// Starts one order: by a process made ahead for steps like its own
    /// if one is ready, else by a clone of its own. The answer to send.
    fn start(&mut self, message: &[u8], fds: Vec<OwnedFd>) -> Reply {
        let mut received = match Received::read(message, fds) {
            Ok(r) => r,
            Err((id, errno)) => return Reply::Refused { id, errno },
        };
        let id = received.id;
        self.blanks.last_order = Some(Instant::now());
        if let Some(blank) = self.blanks.take(&received.order.steps) {
            let handed = self.hand(&blank, &mut received);
            let group = blank.steps.cgroup.as_ref().and_then(sys::Cgroup::name);
            return match handed {
                Ok(()) => {
                    let first = blank.steps.namespaces.as_ref().is_some_and(|n| n.pid);
                    self.started
                        .insert(blank.pid, (blank.held, blank.steps.cgroup));
                    self.firsts.push((blank.pid, blank.socket));
                    Reply::Started {
                        id,
                        pid: blank.pid,
                        group,
                        first,
                    }
                }
                Err(e) => {
                    // It cannot be reached: it is ended, and the order is
                    // refused (the appliance starts it again).
                    sys::kill(blank.pid);
                    self.blanks.discarded.insert(blank.pid, blank.steps);
                    Reply::Refused {
                        id,
                        errno: e.raw_os_error().unwrap_or(libc::EIO),
                    }
                }
            };
        }
        self.blanks.follow(&received.order.steps, self.trees);
        let steps = &mut received.order.steps;
        if let Err(e) = self.group(steps) {
            return Reply::Refused {
                id,
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            };
        }
        let network = self.networks.lend(steps);
        match clone_into(steps) {
            Err(e) => {
                if let Some(group) = steps.cgroup.as_mut() {
                    group.remove();
                }
                Reply::Refused {
                    id,
                    errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
                }
            }
            Ok(0) => received.become_tool(true),
            Ok(pid) => {
                let group = steps.cgroup.as_ref().and_then(sys::Cgroup::name);
                self.started
                    .insert(pid, (network.into_iter().collect(), steps.cgroup.clone()));
                Reply::Started {
                    id,
                    pid,
                    group,
                    first: false,
                }
            }
        }
    }

    /// Makes the group of a process with `steps`, if they have one: named
    /// for this spawner, with the steps' limits (removed again if it
    /// cannot be made whole).
    fn group(&mut self, steps: &mut Steps) -> io::Result<()> {
        let Some(group) = steps.cgroup.as_mut() else {
            return Ok(());
        };
        self.groups += 1;
        group.plan(&format!("tool-{}-{}", std::process::id(), self.groups));
        let made = group.make().and_then(|()| group.limit(None));
        if made.is_err() {
            group.remove();
        }
        made
    }

    /// Makes what `order` binds trees, where this spawner can: the trees,
    /// held until the process has them.
    fn copy_binds(&self, order: &mut Order) -> io::Result<Vec<OwnedFd>> {
        match order
            .steps
            .namespaces
            .as_mut()
            .and_then(|n| n.world.as_mut())
        {
            Some(world) if self.trees => world.bind_as_trees(),
            _ => Ok(Vec::new()),
        }
    }

    /// Hands `received` to the process made ahead `blank`: the order
    /// again, with its trees, and every descriptor.
    fn hand(&self, blank: &Blank, received: &mut Received) -> io::Result<()> {
        if let (Some(made), Some(group)) =
            (&blank.steps.cgroup, received.order.steps.cgroup.as_mut())
        {
            group.take_group(made);
            group.limit(Some(made))?;
        }
        let _trees = self.copy_binds(&mut received.order)?;
        let [stdin, stdout, errors] = &received.io;
        let mut fds = vec![stdin.as_raw_fd(), stdout.as_raw_fd(), errors.as_raw_fd()];
        fds.extend(received.order.steps.descriptors().into_iter().map(|fd| *fd));
        let mut message = received.id.to_le_bytes().to_vec();
        rmp_serde::encode::write(&mut message, &received.order).map_err(io::Error::other)?;
        sys::send_message(blank.socket.as_raw_fd(), &message, &fds)
    }

    /// Makes one more process ahead, for the steps the pool follows.
    fn make_blank(&mut self) {
        let Some(mut steps) = self.blanks.template.clone() else {
            return;
        };
        let Ok((ours, theirs)) = sys::socket_pair(libc::SOCK_SEQPACKET) else {
            return;
        };
        // Its group is made with the limits of the order the pool follows:
        // an order with the same writes none.
        if self.group(&mut steps).is_err() {
            // The pool is stopped until another order is followed.
            self.blanks.template = None;
            return;
        }
        let network = self.networks.lend(&mut steps);
        match clone_into(&steps) {
            Err(_) => {
                if let Some(group) = steps.cgroup.as_mut() {
                    group.remove();
                }
                self.blanks.template = None;
            }
            Ok(0) => {
                drop(ours);
                blank(theirs, &steps)
            }
            Ok(pid) => self.blanks.making.push(Blank {
                pid,
                socket: ours,
                steps,
                held: network.into_iter().collect(),
            }),
        }
    }

    /// A child ended: a tool's end goes to the appliance, and what the
    /// spawner held of it to the maker; a process made ahead is
    /// forgotten and its group removed.
    fn reaped(&mut self, pid: i32, status: i32) -> io::Result<()> {
        if let Some(mut steps) = self.blanks.forget(pid) {
            if let Some(group) = steps.cgroup.as_mut() {
                group.remove();
            }
            return Ok(());
        }
        if let Some((held, _)) = self.started.remove(&pid) {
            self.networks.let_go(held);
        }
        // What it said before it ended, if it had not been read (its
        // socket holds the word, or its end: the read does not wait).
        if let Some(i) = self.firsts.iter().position(|(p, _)| *p == pid) {
            self.heard_first(i)?;
        }
        if self.reported.remove(&pid) {
            return Ok(());
        }
        send(SOCKET, &Reply::Ended { pid, status })
    }

    /// What the `i`th process of [`Serving::firsts`] said: how its tool
    /// ended, which goes to the appliance now (the process stays until a
    /// quiet moment); or nothing, when it execs its tool itself or ends
    /// (its end is reaped).
    fn heard_first(&mut self, i: usize) -> io::Result<()> {
        let (pid, socket) = self.firsts.swap_remove(i);
        let mut word = [0u8; 4];
        match sys::receive_message(socket.as_raw_fd(), &mut word, 0) {
            Ok((4, _)) => {
                self.reported.insert(pid);
                self.lingering.push(socket);
                // Past the most it keeps, the oldest goes now.
                let over = self.lingering.len().saturating_sub(CLOSING);
                self.lingering.drain(..over);
                let status = i32::from_le_bytes(word);
                send(SOCKET, &Reply::Ended { pid, status })
            }
            _ => Ok(()),
        }
    }
}

/// Clones a child into the namespaces `steps` are cloned into, as `fork`
/// would but without the C library's fork handlers (this process has one
/// thread, so no lock is held): 0 in the child, its pid in the spawner.
fn clone_into(steps: &Steps) -> io::Result<i32> {
    let flags = steps.clone_flags() as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: clone without a new stack returns twice, as fork does.
    match unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) } as i32 {
        -1 => Err(io::Error::last_os_error()),
        pid => Ok(pid),
    }
}

/// How many processes the spawner keeps made ahead: a burst of this many
/// tools starts without making one.
const BLANKS: usize = 32;

/// How many it makes at once (one per CPU of a small appliance).
const MAKING: usize = 2;

/// How long no tool must have started for the moment to be quiet: the
/// spawner then makes processes ahead again, the maker closes what ended
/// tools left and the appliance removes their groups, so that none of it
/// slows a burst of starts.
pub(super) const QUIET: std::time::Duration = std::time::Duration::from_millis(100);

/// How many orders in a row that no process made ahead fits move the
/// pool to the steps of the latest.
const MISSES: u32 = 8;

/// Processes made ahead (blanks): each cloned into its namespaces, in
/// its group, with the world every tool shares built, waiting on a socket
/// of its own for the order that tells it the rest. A tool then starts
/// with only its own part: its limits, its own paths and the pivot into
/// its root, its ids, Landlock and the filter. The costly part (a user
/// and PID namespace, a copy of the mount table and a dozen mounts,
/// joining a group, which on cgroup v1 waits for the kernel's read-copy
/// updates) is done when the spawner is otherwise quiet.
///
/// The pool follows the steps of the orders it is asked: made for the
/// steps of one order (its [`Steps::blank`]), it serves every order whose
/// steps are made the same way; [`MISSES`] orders in a row it cannot
/// serve move it to the latest one's.
#[derive(Default)]
struct Blanks {
    template: Option<Steps>,
    making: Vec<Blank>,
    ready: Vec<Blank>,
    /// Ended or being ended, not yet reaped: their steps (their groups).
    discarded: HashMap<i32, Steps>,
    misses: u32,
    last_order: Option<Instant>,
}

/// A process made ahead: its pid, the spawner's end of its socket, the
/// steps it was made with (its group) and what the spawner holds of it.
struct Blank {
    pid: i32,
    socket: OwnedFd,
    steps: Steps,
    held: Vec<OwnedFd>,
}

impl Blanks {
    /// How long the spawner may wait before it makes another (`-1`: until
    /// something happens).
    fn wait(&self) -> libc::c_int {
        if self.template.is_none()
            || self.making.len() >= MAKING
            || self.making.len() + self.ready.len() >= BLANKS
        {
            return -1;
        }
        let since = self.last_order.map_or(QUIET, |t| t.elapsed());
        QUIET
            .saturating_sub(since)
            .as_millis()
            .try_into()
            .unwrap_or(0)
    }

    /// Whether no order has come for [`QUIET`].
    fn quiet(&self) -> bool {
        self.last_order.is_none_or(|t| t.elapsed() >= QUIET)
    }

    /// A ready process made for steps like `steps`, if there is one.
    fn take(&mut self, steps: &Steps) -> Option<Blank> {
        let fits = self.template.as_ref()?.blank()? == steps.blank()?;
        if fits && let Some(blank) = self.ready.pop() {
            self.misses = 0;
            return Some(blank);
        }
        None
    }

    /// Follows the steps of an order no ready process fitted: the first
    /// order's, or after [`MISSES`] in a row the latest.
    fn follow(&mut self, steps: &Steps, pivoted: bool) {
        let Some(wanted) = steps.blank() else { return };
        if self.template.as_ref().and_then(Steps::blank) == Some(wanted) {
            return;
        }
        self.misses += 1;
        if self.template.is_some() && self.misses < MISSES {
            return;
        }
        self.misses = 0;
        for blank in self.making.drain(..).chain(self.ready.drain(..)) {
            sys::kill(blank.pid);
            self.discarded.insert(blank.pid, blank.steps);
        }
        // Only what is made ahead is kept of them: no descriptor of the
        // order's (its numbers are the spawner's, closed once it started).
        let mut template = steps.clone();
        template.landlock = None;
        if let Some(ns) = template.namespaces.as_mut() {
            ns.listeners_to = None;
            ns.network_from = None;
            if let Some(world) = ns.world.as_mut() {
                world.places.truncate(world.shared);
                world.pivoted = pivoted;
            }
        }
        self.template = Some(template);
    }

    /// What a process being made said: it is ready, or it ended.
    fn hear(&mut self, i: usize) {
        let blank = &self.making[i];
        let mut word = [0u8; 1];
        match sys::receive_message(blank.socket.as_raw_fd(), &mut word, 1) {
            Ok((1, fds)) if word == *b"r" => {
                let mut blank = self.making.swap_remove(i);
                blank.held.extend(fds);
                self.ready.push(blank);
            }
            _ => {
                // It failed: ended, and reaped soon. The pool stops until
                // another order is followed.
                let blank = self.making.swap_remove(i);
                sys::kill(blank.pid);
                self.discarded.insert(blank.pid, blank.steps);
                self.template = None;
            }
        }
    }

    /// The steps of process `pid`, if it was made ahead and never given
    /// an order: it is forgotten.
    fn forget(&mut self, pid: i32) -> Option<Steps> {
        if let Some(steps) = self.discarded.remove(&pid) {
            return Some(steps);
        }
        for list in [&mut self.making, &mut self.ready] {
            if let Some(i) = list.iter().position(|b| b.pid == pid) {
                return Some(list.swap_remove(i).steps);
            }
        }
        None
    }
}

/// A process made ahead: takes `steps`' part that is done ahead, says it
/// is ready (with its mount namespace, for the spawner to hold), and waits
/// for its order on `socket`; then becomes the tool. Ends if the spawner
/// does.
fn blank(socket: OwnedFd, steps: &Steps) -> ! {
    // It holds nothing of the spawner's but its own socket and the
    // network it joins: not the appliance's socket (its standard input),
    // not the other processes'.
    let mut steps = steps.clone();
    let network = steps
        .namespaces
        .as_mut()
        .and_then(|n| n.network_from.as_mut());
    let [socket, joined] = sys::keep_only([
        std::os::fd::IntoRawFd::into_raw_fd(socket),
        network.as_deref().copied().unwrap_or(-1),
    ]);
    if let Some(fd) = network {
        *fd = joined;
    }
    let ready = steps.apply_ahead(true).and_then(|()| {
        let world = steps.namespaces.as_ref().is_some_and(|n| n.world.is_some());
        let mount = if world {
            Some(sys::open_namespace(c"/proc/self/ns/mnt")?)
        } else {
            None
        };
        let fds: Vec<RawFd> = mount.iter().map(|m| m.as_raw_fd()).collect();
        sys::send_message(socket, b"r", &fds)
    });
    if ready.is_err() {
        sys::exit(1);
    }
    // A buffer of the order's size, not of the largest: what it touches
    // is undone when it execs, in the burst of starts it is part of.
    let size = match sys::next_message_size(socket) {
        Ok(n) if n > 0 => n.min(MAX_ORDER),
        _ => sys::exit(0),
    };
    let mut buf = vec![0u8; size];
    let received = match sys::receive_message(socket, &mut buf, MAX_FDS) {
        Ok((n, fds)) if n > 0 => Received::read(&buf[..n], fds),
        _ => sys::exit(0),
    };
    let Ok(received) = received else { sys::exit(1) };
    if std::process::id() == 1 {
        first_of_namespace(socket, received)
    }
    sys::close(socket);
    received.become_tool(false)
}

/// The first process of the tool's PID namespace starts the tool as its
/// child, which shares its memory until it execs: the exec undoes none
/// of this process's copy of the spawner, in the burst of starts it is
/// part of. When the tool ends, the rest of the namespace is ended, the
/// spawner is told how the tool ended on `socket`, and this process,
/// alone in the tool's group and holding nothing of the tool's, waits
/// for the spawner to let it go at a quiet moment (or for its group to
/// be removed then): what the kernel undoes of it is undone then.
fn first_of_namespace(socket: RawFd, received: Received) -> ! {
    let argv = pointers(&received.order.argv);
    let env = pointers(&received.order.env);
    let errors = received.io[2].as_raw_fd();
    let tool = match sys::vfork(|| received.exec_as_tool(false, &argv, &env)) {
        Ok(pid) => pid,
        Err(e) => sys::exit_with(errors, e),
    };
    // Its ends of the tool's pipes and descriptors close now, so that
    // the tool's output and the appliance's wait for its exec end with
    // the tool's.
    drop((argv, env, received));
    let status = sys::outlive(tool);
    if sys::send_message(socket, &status.to_le_bytes(), &[]).is_ok() {
        let _ = sys::next_message_size(socket);
    }
    sys::exit(0)
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

    /// Gives `steps` a namespace made ahead, if they make one and one is
    /// ready: a process of the tools' own user namespace (or root's)
    /// joins it; one that makes a user namespace of its own could not.
    /// The namespace is returned to be held until the process ends.
    fn lend(&mut self, steps: &mut Steps) -> Option<OwnedFd> {
        let ns = steps.namespaces.as_mut()?;
        if !ns.network || ns.user_maps.is_some() {
            return None;
        }
        let network = self.ready.pop()?;
        ns.network_from = Some(network.as_raw_fd());
        Some(network)
    }

    /// Lets go of namespaces a process that ended was given: the maker
    /// closes them, at idle priority, once the spawner is quiet.
    fn let_go(&mut self, held: Vec<OwnedFd>) {
        if held.is_empty() {
            return;
        }
        let Some(maker) = &self.maker else { return };
        let fds: Vec<RawFd> = held.iter().map(|fd| fd.as_raw_fd()).collect();
        if sys::send_message(maker.as_raw_fd(), b"c", &fds).is_err() {
            self.maker = None;
        }
    }
}

/// How many descriptors of ended tools the maker holds for a quiet
/// moment (a burst of [`BLANKS`] tools' network and mount namespaces),
/// and how many first processes of ended tools the spawner keeps waiting
/// for one; past that the oldest are let go at once, so that what a
/// stream of tools leaves (their `/tmp` among it) is not held long.
const CLOSING: usize = 2 * BLANKS;

/// The maker: for each byte asked, a child cloned into a new network
/// namespace brings its loopback up and sends the namespace back; what
/// the spawner lets go of it closes when no tool has started for a
/// moment. Ends with the spawner (its socket closes, or it dies).
fn make(socket: OwnedFd) -> ! {
    let _ = sys::idle_priority();
    let _ = sys::die_with_parent();
    let fd = socket.as_raw_fd();
    let mut byte = [0u8; 1];
    // What the spawner let go of, closed once it has been quiet for a
    // moment: the kernel's work of tearing a tool's namespaces down
    // (some of it in its own threads, at normal priority) is not done
    // while tools start.
    let mut closing: Vec<OwnedFd> = Vec::new();
    loop {
        let quiet = if closing.is_empty() {
            -1
        } else {
            QUIET.as_millis() as i32
        };
        match wait_readable(fd, quiet) {
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                closing.clear();
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            _ => {}
        }
        match sys::receive_message(fd, &mut byte, MAX_FDS) {
            Ok((1, _)) if byte == *b"?" => {}
            Ok((1, fds)) => {
                closing.extend(fds);
                // Past the most it holds, the oldest are closed now.
                let over = closing.len().saturating_sub(CLOSING);
                closing.drain(..over);
                continue;
            }
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
        (true, Some(userns)) => {
            sys::join_user_namespace(userns.as_raw_fd())?;
            // Root of the tools' user namespace, it copies trees of a
            // mount namespace of its own (where it cannot, each tool
            // binds its own paths itself).
            let _ = sys::own_mount_namespace();
            Ok(())
        }
        (true, None) => Err(io::Error::other("no user namespace to join")),
    }
}

fn send(socket: RawFd, reply: &Reply) -> io::Result<()> {
    let message = rmp_serde::to_vec(reply).map_err(io::Error::other)?;
    sys::send_message(socket, &message, &[])
}

/// A null-terminated array of pointers to `strings`.
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}
