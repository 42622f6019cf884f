use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // A child this binary started to compile a component (bounded in time and memory,
    // see cro_runtime::compile) runs that and nothing else; any other run registers this
    // executable as the compiler every runtime it makes uses.
    if let Some(code) = cro_runtime::compile::worker::run_as_worker_or_register() {
        return code;
    }
    let cli = cro::Cli::parse();
    // A one-shot command piped into `head` or a closed pager ends quietly, as other
    // command-line tools do, instead of panicking on the broken pipe (Rust ignores
    // SIGPIPE). The operator keeps ignoring it: a log reader going away must not stop it.
    if !matches!(cli.command, cro::Command::Run(_)) {
        // SAFETY: restoring the default disposition of one signal before any thread is
        // started; no handler of ours is replaced.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // The operator explains every step at info; one-shot commands only warn. RUST_LOG
    // overrides both; CRO_LOG_FORMAT=json gives one JSON object per line for collectors.
    // `provider test` provokes failures on purpose: its report says what went wrong.
    let default = match &cli.command {
        cro::Command::Run(_) | cro::Command::KubeletPlugin(_) => "info",
        cro::Command::Provider(cro::ProviderCommand::Test(_)) => "error",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour codes only for a person at a terminal: a file or a log collector gets
    // plain text (NO_COLOR turns them off everywhere).
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if std::env::var("CRO_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json")) {
        builder.json().init();
    } else {
        builder.init();
    }
    match cro::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cro: {}", cro::error_report(&e));
            ExitCode::FAILURE
        }
    }
}
