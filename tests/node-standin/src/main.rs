//! The GPU node software of cro's real-node test tier, as one static multi-call binary.
//!
//! The test image installs this binary under many names; what it does is chosen by the
//! basename it was called by (or by its first argument when called as `node-standin`):
//!
//! - `pause` / `standin-pause`: a container's PID 1 that waits for SIGTERM, announces
//!   the pod to the test's stand-in service and marks itself ready after a delay;
//! - `ready`: the readiness probe (exit 0 iff the ready file exists);
//! - anything else (`sh`, `nvidia-smi`, `chroot`, `modinfo`, ...): the command is
//!   forwarded to the stand-in service, which answers it with the node simulation, and
//!   this process prints the answer and exits (or dies) as the answer says.
//!
//! So a command the operator execs goes through the real path (API server, kubelet,
//! container runtime) and is answered by the same interpreter as in-process tests.

mod forward;
mod http;
mod pause;

/// What the process was asked to be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// PID 1 of a container, with its options.
    Pause(Vec<String>),
    /// The readiness probe.
    Ready,
    /// A node command: argv with the command's basename first.
    Forward(Vec<String>),
    /// Called as `node-standin` without a mode.
    Usage,
}

/// The name the binary is installed under.
const SELF: &str = "node-standin";

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn mode(argv: &[String]) -> Mode {
    let Some(first) = argv.first() else {
        return Mode::Usage;
    };
    let (name, rest) = match basename(first) {
        SELF => match argv.get(1) {
            Some(m) => (basename(m), argv.get(2..).unwrap_or_default()),
            None => return Mode::Usage,
        },
        name => (name, argv.get(1..).unwrap_or_default()),
    };
    match name {
        "pause" | "standin-pause" => Mode::Pause(rest.to_vec()),
        "ready" => Mode::Ready,
        SELF => Mode::Usage,
        other => Mode::Forward(
            std::iter::once(other.to_owned())
                .chain(rest.iter().cloned())
                .collect(),
        ),
    }
}

fn main() {
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match mode(&argv) {
        Mode::Pause(options) => match pause::Options::parse(&options) {
            Ok(options) => pause::run(&options),
            Err(e) => {
                eprintln!("{SELF} pause: {e}");
                std::process::exit(2);
            }
        },
        Mode::Ready => std::process::exit(if pause::is_ready() { 0 } else { 1 }),
        Mode::Forward(argv) => forward::run(&argv),
        Mode::Usage => {
            eprintln!(
                "usage: {SELF} pause [--ready-after-ms N] [--announce ROLE] [--print-env NAME]...\n       {SELF} ready\n       {SELF} COMMAND [ARG]...   (or installed as COMMAND: forwarded to $CRO_STANDIN_URL)"
            );
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn dispatch_by_the_name_called() {
        assert_eq!(
            mode(&argv(&["/pause", "--announce", "driver"])),
            Mode::Pause(argv(&["--announce", "driver"]))
        );
        assert_eq!(mode(&argv(&["standin-pause"])), Mode::Pause(vec![]));
        assert_eq!(mode(&argv(&["/usr/bin/ready"])), Mode::Ready);
        assert_eq!(
            mode(&argv(&["/usr/bin/nvidia-smi", "-L"])),
            Mode::Forward(argv(&["nvidia-smi", "-L"]))
        );
        // The wrapper the operator runs in the driver container keeps its arguments.
        assert_eq!(
            mode(&argv(&["sh", "-c", "exec \"$c\"", "sh", "ls /"])),
            Mode::Forward(argv(&["sh", "-c", "exec \"$c\"", "sh", "ls /"]))
        );
        assert_eq!(
            mode(&argv(&[
                "/usr/sbin/chroot",
                "/host-root",
                "modinfo",
                "nvidia"
            ])),
            Mode::Forward(argv(&["chroot", "/host-root", "modinfo", "nvidia"]))
        );
    }

    #[test]
    fn dispatch_by_the_first_argument_of_node_standin() {
        assert_eq!(
            mode(&argv(&["/node-standin", "pause", "--ready-after-ms", "5"])),
            Mode::Pause(argv(&["--ready-after-ms", "5"]))
        );
        assert_eq!(mode(&argv(&["/node-standin", "ready"])), Mode::Ready);
        assert_eq!(
            mode(&argv(&["node-standin", "lsmod"])),
            Mode::Forward(argv(&["lsmod"]))
        );
        assert_eq!(mode(&argv(&["/node-standin"])), Mode::Usage);
        assert_eq!(mode(&argv(&["node-standin", "node-standin"])), Mode::Usage);
        assert_eq!(mode(&[]), Mode::Usage);
    }
}
