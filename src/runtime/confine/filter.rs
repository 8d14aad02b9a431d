//! The system-call filter every tool process runs under: seccomp-BPF,
//! compiled once by `seccompiler` (rust-vmm's) for the machine's
//! architecture and installed by the child in two parts: all but the
//! mount calls once its namespaces are made (by a process made ahead,
//! before its order comes), and the mount calls once its world is built,
//! last before it execs. The kernel compiles and checks each program it
//! is given; what a tool start waits for is the small second part.
//!
//! What it refuses closes what the namespaces and Landlock leave open:
//! sockets other than IP (a network namespace bounds IP; nothing bounds a
//! Unix-domain or netlink socket but not having one), tracing and reading
//! other processes, the kernel's key rings, BPF, performance counters,
//! `userfaultfd`, module and kernel loading, every mount call (the world
//! is built before the filter), and new namespaces. A refused call fails
//! with `EPERM`: the tool sees an error, not a kill. `clone3` answers
//! `ENOSYS` instead (its flags sit behind a pointer no filter can read),
//! so the C library falls back to `clone`, whose flags are checked.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// The filter's name and version, as receipts give it. The version moves
/// whenever what it refuses changes.
pub const NAME: &str = "agentbay-tools/1";

/// The programs a tool installs: those it installs once its namespaces
/// are made, in order, and the one it installs last.
pub struct Programs {
    ahead: Vec<BpfProgram>,
    last: BpfProgram,
}

impl Programs {
    /// The programs installed once the namespaces are made, each a slice
    /// the child hands to the kernel.
    pub fn ahead(&self) -> impl Iterator<Item = &[seccompiler::sock_filter]> {
        self.ahead.iter().map(Vec::as_slice)
    }

    /// The program installed last, once the world is built: the mount
    /// calls.
    pub fn last(&self) -> &[seccompiler::sock_filter] {
        &self.last
    }
}

/// The calls that build a world: refused last, once it is built.
fn mounting() -> Vec<i64> {
    vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
    ]
}

/// Calls refused whatever their arguments, once the namespaces are made
/// (the mount calls apart: [`mounting`]).
fn refused() -> Vec<i64> {
    let mut calls = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_kcmp,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_setns,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_acct,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_syslog,
        libc::SYS_quotactl,
        libc::SYS_vhangup,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_adjtimex,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_fanotify_init,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_uselib,
        libc::SYS_modify_ldt,
    ]);
    calls
}

fn cond(arg: u8, op: Op, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, Len::Dword, op, value).expect("a valid condition")
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("a rule with conditions")
}

/// The namespace flags no tool may ask `clone` or `unshare` for.
const NEW_NAMESPACES: [u64; 8] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

/// The personalities a program may set: Linux's own, 32-bit Linux, and
/// the query (`0xffffffff`); not the ones that turn off address-space
/// randomisation or make reads executable.
const PERSONALITIES: [u64; 5] = [0, 8, 0x20000, 0x20008, 0xffff_ffff];

/// Compiles the filter for this machine, or why it cannot be (an
/// architecture `seccompiler` does not know).
pub fn compile() -> Result<Programs, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        format!(
            "no system-call filter for {}: {e:?}",
            std::env::consts::ARCH
        )
    })?;
    // What is decided by the argument goes through seccompiler; what is
    // decided by the number alone, in a search of its own (below).
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // Sockets: IP only (the tool's network namespace bounds it); Unix
    // sockets only as a connected pair, which reaches nobody else.
    rules.insert(
        libc::SYS_socket,
        vec![rule(vec![
            cond(0, Op::Ne, libc::AF_INET as u64),
            cond(0, Op::Ne, libc::AF_INET6 as u64),
        ])],
    );
    rules.insert(
        libc::SYS_socketpair,
        vec![rule(vec![cond(0, Op::Ne, libc::AF_UNIX as u64)])],
    );
    let namespaces = |arg: u8| {
        NEW_NAMESPACES
            .iter()
            .map(|flag| rule(vec![cond(arg, Op::MaskedEq(*flag), *flag)]))
            .collect::<Vec<_>>()
    };
    rules.insert(libc::SYS_clone, namespaces(0));
    rules.insert(libc::SYS_unshare, namespaces(0));
    rules.insert(
        libc::SYS_personality,
        vec![rule(
            PERSONALITIES.iter().map(|p| cond(0, Op::Ne, *p)).collect(),
        )],
    );
    // Typing into the terminal of another process.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, Op::Eq, libc::TIOCSTI)]),
            rule(vec![cond(1, Op::Eq, libc::TIOCLINUX)]),
        ],
    );
    let eperm = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("the system-call filter does not compile: {e}"))?;
    let mut by_number: BTreeMap<u32, u32> = refused()
        .into_iter()
        .map(|call| (call as u32, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32))
        .collect();
    by_number.insert(
        libc::SYS_clone3 as u32,
        libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    );
    let mounts: BTreeMap<u32, u32> = mounting()
        .into_iter()
        .map(|call| (call as u32, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32))
        .collect();
    Ok(Programs {
        ahead: vec![
            by_number_program(&by_number)?,
            BpfProgram::try_from(eperm).map_err(|e| format!("the system-call filter: {e}"))?,
        ],
        last: by_number_program(&mounts)?,
    })
}

/// On x86_64 the x32 calls share the architecture's audit number, with
/// bit 30 set in the call's number: a filter keyed on numbers would let
/// them all through, so every number with it is refused (no tool needs
/// the x32 ABI).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The calls decided by their number alone (`actions`: number to the
/// filter's return value; every other call is allowed), as a balanced
/// binary search over the numbers. `seccompiler` compares a call against
/// each listed number in turn, and when a filter is installed the kernel
/// runs it over every call number to learn which it may skip later: a
/// chain of sixty comparisons made each tool start cost 0.4 ms there,
/// and a search of six levels costs a tenth of that. On x86_64 the x32
/// calls are refused first. The other filter (seccompiler's) checks the
/// architecture and kills a call of any other.
fn by_number_program(actions: &BTreeMap<u32, u32>) -> Result<BpfProgram, String> {
    use seccompiler::sock_filter;
    /// One step of the search, before its jumps are resolved.
    enum Step {
        /// `nr == k`: return `action`; else on.
        Is { k: u32, action: u32 },
        /// `nr >= k`: to step `to`; else on.
        From { k: u32, to: usize },
        /// Return "allow".
        Allow,
    }
    fn search(numbers: &[(u32, u32)], steps: &mut Vec<Step>) {
        if numbers.len() <= 3 {
            steps.extend(numbers.iter().map(|&(k, action)| Step::Is { k, action }));
            steps.push(Step::Allow);
            return;
        }
        let (below, from) = numbers.split_at(numbers.len() / 2);
        let at = steps.len();
        steps.push(Step::From {
            k: from[0].0,
            to: 0,
        });
        search(below, steps);
        let to = steps.len();
        steps[at] = Step::From { k: from[0].0, to };
        search(from, steps);
    }
    let numbers: Vec<(u32, u32)> = actions.iter().map(|(k, a)| (*k, *a)).collect();
    let mut steps = Vec::new();
    search(&numbers, &mut steps);
    // The program: load the number, refuse x32, the search, then one
    // return for each action the search can end in.
    let mut returns: Vec<u32> = actions.values().copied().collect();
    let x32_refused = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    if cfg!(target_arch = "x86_64") {
        returns.push(x32_refused);
    }
    returns.sort_unstable();
    returns.dedup();
    let head = if cfg!(target_arch = "x86_64") { 2 } else { 1 };
    let first_return = head + steps.len();
    let jump = |from: usize, to: usize| -> Result<u8, String> {
        u8::try_from(to - from - 1)
            .map_err(|_| "the system-call filter's search is too long to jump over".to_string())
    };
    let return_at = |action: u32| first_return + returns.binary_search(&action).expect("listed");
    let op = |code: u32| code as u16;
    let mut program = vec![sock_filter {
        code: op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS),
        jt: 0,
        jf: 0,
        k: 0, // seccomp_data.nr
    }];
    if cfg!(target_arch = "x86_64") {
        program.push(sock_filter {
            code: op(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K),
            jt: jump(1, return_at(x32_refused))?,
            jf: 0,
            k: X32_SYSCALL_BIT,
        });
    }
    for (i, step) in steps.iter().enumerate() {
        let at = head + i;
        program.push(match *step {
            Step::Is { k, action } => sock_filter {
                code: op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
                jt: jump(at, return_at(action))?,
                jf: 0,
                k,
            },
            Step::From { k, to } => sock_filter {
                code: op(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K),
                jt: jump(at, head + to)?,
                jf: 0,
                k,
            },
            Step::Allow => sock_filter {
                code: op(libc::BPF_RET | libc::BPF_K),
                jt: 0,
                jf: 0,
                k: libc::SECCOMP_RET_ALLOW,
            },
        });
    }
    program.extend(returns.iter().map(|&k| sock_filter {
        code: op(libc::BPF_RET | libc::BPF_K),
        jt: 0,
        jf: 0,
        k,
    }));
    Ok(program)
}

/// The filter for this machine, compiled on first use and kept: the
/// appliance's probes and the tool spawner each compile it once.
pub fn programs() -> Result<&'static Programs, String> {
    static PROGRAMS: std::sync::OnceLock<Result<Programs, String>> = std::sync::OnceLock::new();
    PROGRAMS.get_or_init(compile).as_ref().map_err(Clone::clone)
}

/// Installs `programs` on the calling process (and `PR_SET_NO_NEW_PRIVS`
/// with them). Runs between fork and exec: no allocation, system calls
/// only.
pub fn install<'a>(
    programs: impl IntoIterator<Item = &'a [seccompiler::sock_filter]>,
) -> std::io::Result<()> {
    for p in programs {
        seccompiler::apply_filter(p).map_err(|e| match e {
            seccompiler::Error::Seccomp(e) | seccompiler::Error::Prctl(e) => e,
            _ => std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_compiles_for_this_machine() {
        let programs = compile().unwrap();
        assert!(
            programs
                .ahead()
                .chain(std::iter::once(programs.last()))
                .all(|p| !p.is_empty() && p.len() < 4096)
        );
    }

    /// Runs a program of loads of the number, comparisons with constants,
    /// jumps and returns (all the search is made of) on the call `nr`.
    fn run(program: &[seccompiler::sock_filter], nr: u32) -> u32 {
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let i = &program[pc];
            let code = u32::from(i.code);
            pc += 1;
            match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    assert_eq!(i.k, 0, "only the number is loaded");
                    a = nr;
                }
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf });
                }
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => {
                    pc += usize::from(if a >= i.k { i.jt } else { i.jf });
                }
                c if c == libc::BPF_RET | libc::BPF_K => return i.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
        }
    }

    /// The search decides every number as the table does: each listed one
    /// its action, every x32 call refused, every other allowed, with a
    /// path of a few steps.
    #[test]
    fn the_search_by_number_decides_each_call_as_listed() {
        let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
        for size in [0usize, 1, 2, 3, 4, 7, 60] {
            let table: BTreeMap<u32, u32> = (0..size as u32)
                .map(|i| (3 + i * 5, if i % 7 == 0 { enosys } else { eperm }))
                .collect();
            let program = by_number_program(&table).unwrap();
            for nr in 0..1200 {
                let expected = table.get(&nr).copied().unwrap_or(libc::SECCOMP_RET_ALLOW);
                assert_eq!(run(&program, nr), expected, "size {size}, call {nr}");
            }
            if cfg!(target_arch = "x86_64") {
                assert_eq!(run(&program, X32_SYSCALL_BIT), eperm);
                assert_eq!(run(&program, X32_SYSCALL_BIT | 3), eperm);
            }
        }
        // A table too large to jump across is refused, not miscompiled.
        let huge: BTreeMap<u32, u32> = (0..400).map(|i| (i * 2, eperm)).collect();
        assert!(by_number_program(&huge).is_err());
        let refused: BTreeMap<u32, u32> = refused()
            .into_iter()
            .chain(mounting())
            .map(|c| (c as u32, eperm))
            .collect();
        let program = by_number_program(&refused).unwrap();
        assert_eq!(run(&program, libc::SYS_ptrace as u32), eperm);
        assert_eq!(
            run(&program, libc::SYS_read as u32),
            libc::SECCOMP_RET_ALLOW
        );
        assert!(program.len() < 3 * refused.len(), "{}", program.len());
    }
}
