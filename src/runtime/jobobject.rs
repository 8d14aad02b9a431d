//! Tool processes on Windows: a Job Object per process tree, with the
//! lease's CPUs as a hard CPU rate cap, its memory as the job's memory
//! limit, `runtime.tool_pids_max` active processes, and kill-on-close, so
//! that the tree ends when the lease does (or the appliance). The network
//! and files are not restricted on Windows; each call says so.

use std::ffi::c_void;

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_CPU_RATE_CONTROL_ENABLE,
    JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP, JOB_OBJECT_LIMIT_ACTIVE_PROCESS,
    JOB_OBJECT_LIMIT_JOB_MEMORY, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION, JOBOBJECT_CPU_RATE_CONTROL_INFORMATION,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JobObjectBasicAccountingInformation,
    JobObjectCpuRateControlInformation, JobObjectExtendedLimitInformation,
    QueryInformationJobObject, SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Threading::{OpenProcess, PROCESS_SET_QUOTA, PROCESS_TERMINATE};

use crate::domain::amount::Amount;

/// A Job Object holding one tool process tree.
pub struct Job {
    handle: HANDLE,
    cpu: Amount,
    memory_bytes: u64,
    pids: u32,
    killed_by: std::sync::Mutex<Option<String>>,
}

// SAFETY: a job handle may be used from any thread.
unsafe impl Send for Job {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for Job {}

fn size<T>() -> u32 {
    std::mem::size_of::<T>() as u32
}

impl Job {
    /// A job limited to `cpu` CPUs, `memory_bytes` and `pids` processes.
    pub fn new(cpu: Amount, memory_bytes: u64, pids: u32) -> Result<Job, String> {
        let job = Job::kill_on_close(cpu, memory_bytes, pids)?;
        let mut limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
            | JOB_OBJECT_LIMIT_JOB_MEMORY
            | JOB_OBJECT_LIMIT_ACTIVE_PROCESS;
        limits.BasicLimitInformation.ActiveProcessLimit = pids;
        limits.JobMemoryLimit = memory_bytes as usize;
        job.set(
            "memory and process limits",
            JobObjectExtendedLimitInformation,
            &limits,
        )?;
        // The rate is in hundredths of a percent of all the machine's CPUs.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let rate = (cpu.thousandths() * 10 / cpus).clamp(1, 10_000) as u32;
        let mut rate_info = JOBOBJECT_CPU_RATE_CONTROL_INFORMATION {
            ControlFlags: JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP,
            ..Default::default()
        };
        rate_info.Anonymous.CpuRate = rate;
        job.set(
            "CPU rate cap",
            JobObjectCpuRateControlInformation,
            &rate_info,
        )?;
        Ok(job)
    }

    /// A job whose only limit is kill-on-close (the start's probe, where
    /// the host refuses the others).
    fn kill_on_close(cpu: Amount, memory_bytes: u64, pids: u32) -> Result<Job, String> {
        // SAFETY: no attributes, no name; a null handle is a failure.
        let handle = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if handle.is_null() {
            return Err(format!(
                "no Job Object for the tool: {}",
                std::io::Error::last_os_error()
            ));
        }
        let job = Job {
            handle,
            cpu,
            memory_bytes,
            pids,
            killed_by: std::sync::Mutex::new(None),
        };
        let mut limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        job.set("kill-on-close", JobObjectExtendedLimitInformation, &limits)?;
        Ok(job)
    }

    /// Sets the job's information of `class`, whose type is `T`.
    fn set<T>(&self, what: &str, class: i32, info: &T) -> Result<(), String> {
        let ptr = info as *const T as *const c_void;
        // SAFETY: `info` is a live value of the class's type, `size::<T>()`
        // bytes long.
        if unsafe { SetInformationJobObject(self.handle, class, ptr, size::<T>()) } == 0 {
            return Err(format!(
                "the tool's Job Object refused its {what}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Puts the started process `pid` (and so its children) in the job.
    pub fn assign(&self, pid: u32) -> Result<(), String> {
        // SAFETY: a process handle opened for this and closed below.
        unsafe {
            let process = OpenProcess(PROCESS_SET_QUOTA | PROCESS_TERMINATE, 0, pid);
            if process.is_null() {
                return Err(format!(
                    "the tool process {pid} cannot be opened: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let ok = AssignProcessToJobObject(self.handle, process);
            let err = std::io::Error::last_os_error();
            CloseHandle(process);
            if ok == 0 {
                return Err(format!(
                    "the tool process {pid} cannot join its Job Object: {err}"
                ));
            }
        }
        Ok(())
    }

    /// Ends every process of the job, saying why.
    pub fn kill(&self, why: &str) {
        if let Ok(mut k) = self.killed_by.lock()
            && k.is_none()
        {
            *k = Some(why.to_string());
        }
        // SAFETY: the job's own handle.
        unsafe {
            TerminateJobObject(self.handle, 1);
        }
    }

    /// What bound the tree and what it used, as each call's receipt shows
    /// it.
    pub fn report(&self) -> serde_json::Value {
        let mut limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        let mut accounting: JOBOBJECT_BASIC_ACCOUNTING_INFORMATION =
            // SAFETY: a plain C struct of integers.
            unsafe { std::mem::zeroed() };
        // SAFETY: buffers of the classes' types and sizes.
        let (peak, cpu) = unsafe {
            let peak = (QueryInformationJobObject(
                self.handle,
                JobObjectExtendedLimitInformation,
                &mut limits as *mut _ as *mut c_void,
                size::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>(),
                std::ptr::null_mut(),
            ) != 0)
                .then_some(limits.PeakJobMemoryUsed as u64);
            let cpu = (QueryInformationJobObject(
                self.handle,
                JobObjectBasicAccountingInformation,
                &mut accounting as *mut _ as *mut c_void,
                size::<JOBOBJECT_BASIC_ACCOUNTING_INFORMATION>(),
                std::ptr::null_mut(),
            ) != 0)
                // 100-nanosecond units.
                .then_some((accounting.TotalUserTime + accounting.TotalKernelTime) as f64 / 1e7);
            (peak, cpu)
        };
        serde_json::json!({
            "mechanism": "job-object",
            "group": null,
            "cpu": self.cpu,
            "memoryBytes": self.memory_bytes,
            "pids": self.pids,
            "network": "host (not isolated on Windows)",
            "files": "not restricted on Windows",
            "peakMemoryBytes": peak,
            "cpuSeconds": cpu,
            "killedBy": self.killed_by.lock().ok().and_then(|k| k.clone()),
        })
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Kill-on-close: closing the last handle ends every process in it.
        // SAFETY: the job's own handle, closed once.
        unsafe {
            CloseHandle(self.handle);
        }
    }
}

/// What this host enforces on tool processes, as [`probe`] found it at
/// start: `/readyz` and the System page say it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostReport {
    /// `job-object`, or `refused` when this host cannot make a Job Object
    /// with every limit (tool processes are then refused).
    pub mechanism: String,
    /// The limits a tool's job holds (CPU rate, memory, processes), or
    /// which one the host refused.
    pub limits: String,
    /// Whether a tool's process tree ends when its job closes, as the
    /// probe saw it happen.
    pub kill_on_close: String,
    /// Networks are not isolated on Windows.
    pub network: String,
    /// Files are not restricted on Windows.
    pub files: String,
}

/// Makes a Job Object with every limit a tool gets, starts a process in
/// it (`ping -n 30 127.0.0.1` from System32), closes the job and watches
/// the process end: what this host really enforces, not what it should.
/// Blocks up to five seconds.
pub fn probe() -> HostReport {
    let mut report = HostReport {
        mechanism: "job-object".into(),
        limits: "cpu rate (hard cap), memory, active processes".into(),
        kill_on_close: String::new(),
        network: "host (not isolated on Windows)".into(),
        files: "not restricted on Windows".into(),
    };
    let job = match Job::new(Amount::units(1), 256 * 1024 * 1024, 4) {
        Ok(job) => job,
        Err(why) => {
            // Tools are refused here; whether a job still ends its
            // processes is worth knowing all the same.
            report.mechanism = "refused".into();
            report.limits = why;
            match Job::kill_on_close(Amount::units(1), 0, 0) {
                Ok(job) => job,
                Err(why) => {
                    report.kill_on_close = format!("not probed: {why}");
                    return report;
                }
            }
        }
    };
    let system = std::env::var_os("SystemRoot")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "C:\\Windows".into());
    let child = std::process::Command::new(system.join("System32").join("ping.exe"))
        .args(["-n", "30", "127.0.0.1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            report.kill_on_close = format!("not probed: the probe's process did not start ({e})");
            return report;
        }
    };
    if let Err(why) = job.assign(child.id()) {
        let _ = child.kill();
        let _ = child.wait();
        report.kill_on_close = format!("not probed: {why}");
        return report;
    }
    drop(job);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    report.kill_on_close = loop {
        match child.try_wait() {
            Ok(Some(_)) => {
                break "verified at start: a process in a job ended when the job closed".into();
            }
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break "NOT enforced: the probe's process outlived its job by 5 s; a tool tree may outlive its lease".into();
            }
        }
    };
    report
}

static HOST: std::sync::OnceLock<HostReport> = std::sync::OnceLock::new();

/// Runs [`probe`] once, on a thread of its own (the appliance's start).
pub fn start_probe() {
    std::thread::spawn(|| {
        let report = probe();
        tracing::info!(
            mechanism = %report.mechanism,
            limits = %report.limits,
            kill_on_close = %report.kill_on_close,
            "tool processes on this host"
        );
        let _ = HOST.set(report);
    });
}

/// What the start's probe found; while it runs, says so.
pub fn host() -> HostReport {
    HOST.get().cloned().unwrap_or_else(|| HostReport {
        mechanism: "job-object".into(),
        limits: "being probed".into(),
        kill_on_close: "being probed".into(),
        network: "host (not isolated on Windows)".into(),
        files: "not restricted on Windows".into(),
    })
}
