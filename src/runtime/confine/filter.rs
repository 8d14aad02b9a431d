//! The system-call filter every tool process runs under: seccomp-BPF,
//! compiled once by `seccompiler` (rust-vmm's) for the machine's
//! architecture and installed by the child after its world is built and
//! before it execs.
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

/// The programs a tool installs, in order.
pub struct Programs(Vec<BpfProgram>);

impl Programs {
    /// The programs, each a slice the child hands to the kernel.
    pub fn each(&self) -> impl Iterator<Item = &[seccompiler::sock_filter]> {
        self.0.iter().map(Vec::as_slice)
    }
}

/// Calls refused whatever their arguments.
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
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        refused().into_iter().map(|call| (call, vec![])).collect();
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
    let enosys = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| format!("the system-call filter does not compile: {e}"))?;
    let mut programs = Vec::new();
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_refused());
    for f in [eperm, enosys] {
        programs.push(BpfProgram::try_from(f).map_err(|e| format!("the system-call filter: {e}"))?);
    }
    Ok(Programs(programs))
}

/// On x86_64 the x32 calls share the architecture's audit number, with
/// bit 30 set in the call's number: a filter keyed on numbers would let
/// them all through. This one refuses every x32 call (no tool needs the
/// x32 ABI). `seccompiler` keys its rules on exact numbers, so these four
/// instructions are written out.
#[cfg(target_arch = "x86_64")]
fn x32_refused() -> BpfProgram {
    use seccompiler::sock_filter;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let stmt = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    vec![
        // A = seccomp_data.nr
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        // if A >= X32_SYSCALL_BIT goto refuse else goto allow
        sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            jt: 1,
            jf: 0,
            k: X32_SYSCALL_BIT,
        },
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
    ]
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
pub fn install(programs: &Programs) -> std::io::Result<()> {
    for p in programs.each() {
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
        assert!(programs.each().all(|p| !p.is_empty() && p.len() < 4096));
    }
}
