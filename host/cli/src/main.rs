use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = cro::Cli::parse();
    match cro::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cro: {e:#}");
            ExitCode::FAILURE
        }
    }
}
