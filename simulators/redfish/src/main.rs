//! `redfish-sim`: serves the Redfish composition simulator until interrupted and prints
//! how to reach it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use redfish_sim::{RedfishSim, SimConfig};

#[derive(Parser, Debug)]
#[command(
    name = "redfish-sim",
    about = "Simulated DMTF Redfish composition service on 127.0.0.1 (docs/redfish-api.md)"
)]
struct Args {
    /// A computer system (cluster node). Repeatable.
    #[arg(long = "system", short = 's')]
    systems: Vec<String>,
    /// Free GPU blocks: `MODEL[:COUNT]`. Repeatable.
    #[arg(long = "gpu")]
    gpus: Vec<String>,
    /// Free CXL memory blocks: `MODEL[:COUNT]`. Repeatable.
    #[arg(long = "cxl")]
    cxl: Vec<String>,
    #[arg(long, default_value = "admin")]
    user: String,
    #[arg(long, default_value = "redfish-sim-password")]
    password: String,
    /// How long a recomposition takes (0: the PATCH answers at once).
    #[arg(long, default_value_t = 0)]
    compose_delay_ms: u64,
    #[arg(long, default_value_t = 1800)]
    session_timeout_secs: u64,
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Print the connection details as one JSON object.
    #[arg(long)]
    json: bool,
}

fn model_count(spec: &str) -> Result<(String, usize)> {
    match spec.rsplit_once(':') {
        Some((model, n)) if n.chars().all(|c| c.is_ascii_digit()) && !n.is_empty() => Ok((
            model.to_string(),
            n.parse().with_context(|| format!("count in {spec}"))?,
        )),
        _ if spec.is_empty() => bail!("an empty model"),
        _ => Ok((spec.to_string(), 1)),
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sim = RedfishSim::start(SimConfig {
        username: args.user,
        password: args.password,
        session_timeout: Duration::from_secs(args.session_timeout_secs),
        compose_delay: Duration::from_millis(args.compose_delay_ms),
        port: args.port,
    })?;
    for s in &args.systems {
        sim.add_system(s);
    }
    for spec in &args.gpus {
        let (model, n) = model_count(spec)?;
        for _ in 0..n {
            sim.add_gpu_block(&model);
        }
    }
    for spec in &args.cxl {
        let (model, n) = model_count(spec)?;
        for _ in 0..n {
            sim.add_cxl_block(&model);
        }
    }
    let (user, password) = sim.credentials();
    if args.json {
        println!(
            "{}",
            serde_json::json!({"endpoint": sim.endpoint(), "username": user, "password": password})
        );
    } else {
        println!(
            "Redfish service at {}redfish/v1/ (user {user}, password {password})",
            sim.endpoint()
        );
    }
    // Serves on its own thread until the process is interrupted.
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_counts() {
        assert_eq!(model_count("A100:3").unwrap(), ("A100".into(), 3));
        assert_eq!(
            model_count("NVIDIA A100 80GB").unwrap(),
            ("NVIDIA A100 80GB".into(), 1)
        );
        assert_eq!(model_count("H100:x").unwrap(), ("H100:x".into(), 1));
        assert!(model_count("").is_err());
    }
}
