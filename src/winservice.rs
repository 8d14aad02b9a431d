//! The Windows service the MSI registers (`agentbay serve
//! --windows-service`): the Service Control Manager's stop and shutdown
//! controls reach the same shutdown path as SIGTERM (drain, stop workers,
//! flush the store).

use std::ffi::OsString;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use windows_service::service::{
    ServiceControl, ServiceControlAccept, ServiceExitCode, ServiceState, ServiceStatus, ServiceType,
};
use windows_service::service_control_handler::{self, ServiceControlHandlerResult};
use windows_service::{define_windows_service, service_dispatcher};

use crate::app::{self, Clocks};
use crate::config::Config;

/// The service name the MSI installs.
pub const NAME: &str = "agentbay";

static START: OnceLock<Mutex<Option<(Config, tokio::runtime::Handle)>>> = OnceLock::new();

define_windows_service!(ffi_service_main, service_main);

/// Hands this process to the Service Control Manager; returns when the
/// service has stopped. Blocks: call it off the async runtime.
pub fn run(config: Config, runtime: tokio::runtime::Handle) -> anyhow::Result<()> {
    START
        .get_or_init(|| Mutex::new(None))
        .lock()
        .expect("start slot")
        .replace((config, runtime));
    service_dispatcher::start(NAME, ffi_service_main)?;
    Ok(())
}

fn service_main(_arguments: Vec<OsString>) {
    if let Err(e) = serve() {
        // The whole chain of causes, not only the outermost context.
        tracing::error!(
            error = format!("{e:#}"),
            "the agentbay service stopped on an error"
        );
    }
}

fn serve() -> anyhow::Result<()> {
    let (config, runtime) = START
        .get()
        .and_then(|slot| slot.lock().ok()?.take())
        .ok_or_else(|| anyhow::anyhow!("the service started twice"))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop_tx = Mutex::new(Some(stop_tx));
    let status = service_control_handler::register(NAME, move |control| match control {
        ServiceControl::Stop | ServiceControl::Shutdown | ServiceControl::Preshutdown => {
            if let Some(tx) = stop_tx.lock().ok().and_then(|mut t| t.take()) {
                let _ = tx.send(());
            }
            ServiceControlHandlerResult::NoError
        }
        ServiceControl::Interrogate => ServiceControlHandlerResult::NoError,
        _ => ServiceControlHandlerResult::NotImplemented,
    })?;
    let report_as = |state, accept, wait: Duration, code: u32| {
        status.set_service_status(ServiceStatus {
            service_type: ServiceType::OWN_PROCESS,
            current_state: state,
            controls_accepted: accept,
            // A service-specific 1 is "stopped on an error": the log
            // (log.dir) says which.
            exit_code: if code == 0 {
                ServiceExitCode::Win32(0)
            } else {
                ServiceExitCode::ServiceSpecific(code)
            },
            checkpoint: 0,
            wait_hint: wait,
            process_id: None,
        })
    };
    let report = |state, accept, wait: Duration| report_as(state, accept, wait, 0);
    // Opening the store can take a while (a crash-cut group completed, a
    // store of an earlier version backed up and migrated): "start pending"
    // until the listener is up, then "running". The drain and the store's
    // close take up to the drain deadline: "stop pending" as soon as the
    // stop is asked, and "stopped" only once every acknowledged write is
    // on disk and the data directory's lock is let go, so a start right
    // after never finds the previous process still holding the store.
    report(
        ServiceState::StartPending,
        ServiceControlAccept::empty(),
        Duration::from_secs(300),
    )?;
    let drain = Duration::from_secs(config.http.drain_seconds + 10);
    // `app::run` polls its shutdown future once it serves.
    let result = runtime.block_on(app::run(config, Clocks::system(), async move {
        report(
            ServiceState::Running,
            ServiceControlAccept::STOP | ServiceControlAccept::SHUTDOWN,
            Duration::ZERO,
        )
        .ok();
        let _ = stop_rx.await;
        report(
            ServiceState::StopPending,
            ServiceControlAccept::empty(),
            drain,
        )
        .ok();
    }));
    report_as(
        ServiceState::Stopped,
        ServiceControlAccept::empty(),
        Duration::ZERO,
        u32::from(result.is_err()),
    )?;
    result
}
