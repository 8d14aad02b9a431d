//! What the host has, as the operating system tells this process: the
//! CPUs it may run on (its affinity and its control group's CPU quota) and
//! the memory it may use (the machine's, or its control group's limit when
//! lower). See `domain::capacity::host` for what the pools may promise.

use crate::domain::capacity::HostResources;

/// The host's CPUs and memory; `None` when they cannot be read.
pub fn probe() -> Option<HostResources> {
    let cpus = std::thread::available_parallelism().ok()?.get() as f64;
    let memory_gb = memory_bytes()? as f64 / (1024.0 * 1024.0 * 1024.0);
    Some(HostResources { cpus, memory_gb })
}

#[cfg(target_os = "linux")]
fn memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = meminfo.lines().find_map(|l| {
        let kb = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
        kb.trim().parse::<u64>().ok().map(|kb| kb * 1024)
    })?;
    Some(cgroup_limit().map_or(total, |limit| limit.min(total)))
}

/// The memory limit of this process's control group (v2, else v1), when
/// it has one.
#[cfg(target_os = "linux")]
fn cgroup_limit() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |path: String| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // v2: "0::/system.slice/agentbay.service"; "max" does not parse.
    if let Some(path) = groups.lines().find_map(|l| l.strip_prefix("0::"))
        && let Some(limit) = read(format!("/sys/fs/cgroup{}/memory.max", path.trim_end()))
    {
        return Some(limit);
    }
    // v1: "N:memory:/path"; an unlimited group reads as a huge number,
    // which the machine's total caps.
    let path = groups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    read(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes".into()))
}

#[cfg(windows)]
fn memory_bytes() -> Option<u64> {
    use windows_sys::Win32::System::SystemInformation::{GlobalMemoryStatusEx, MEMORYSTATUSEX};
    // SAFETY: a zeroed MEMORYSTATUSEX with its length set is what the call
    // fills.
    unsafe {
        let mut status: MEMORYSTATUSEX = std::mem::zeroed();
        status.dwLength = std::mem::size_of::<MEMORYSTATUSEX>() as u32;
        (GlobalMemoryStatusEx(&mut status) != 0).then_some(status.ullTotalPhys)
    }
}

#[cfg(not(any(target_os = "linux", windows)))]
fn memory_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_host_has_cpus_and_memory() {
        let host = super::probe().expect("the host's resources");
        assert!(host.cpus >= 1.0, "{host:?}");
        assert!(host.memory_gb > 0.1, "{host:?}");
    }
}
