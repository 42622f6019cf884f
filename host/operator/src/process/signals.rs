//! The signals the process stops on: SIGINT or SIGTERM from outside, and the shutdown
//! signal the operator's own tasks wait on.

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

/// A shutdown signal many tasks can wait on (Sync, as kube's controllers require).
pub(crate) type Signal = Shared<BoxFuture<'static, ()>>;

pub(crate) fn signal() -> (futures::channel::oneshot::Sender<()>, Signal) {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    (tx, rx.map(|_| ()).boxed().shared())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            futures::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                futures::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = futures::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
