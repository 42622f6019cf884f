//! Child processes that never outlive the test process.
//!
//! Each child gets its own process group (so one signal reaches anything it forks) and
//! `PR_SET_PDEATHSIG=SIGKILL`. The kernel sends that signal when the *thread* that forked the
//! child exits, not the process, and test threads come and go; so all children are forked
//! by one spawner thread that lives as long as the process.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::cleanup::{HarnessDir, Registration};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> io::Result<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    if let Some(tx) = SPAWNER.get() {
        return Ok(tx.lock().unwrap_or_else(|p| p.into_inner()).clone());
    }
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new()
        .name("kube-harness-spawner".into())
        .spawn(move || {
            // Ends only when every sender is gone, which the static one never is.
            for (mut command, reply) in rx {
                let _ = reply.send(spawn_here(&mut command));
            }
        })?;
    // Another thread may have won the race; its spawner is used and ours exits.
    let tx = SPAWNER.get_or_init(|| Mutex::new(tx));
    Ok(tx.lock().unwrap_or_else(|p| p.into_inner()).clone())
}

/// Starts `command` in its own process group, killed when this process dies (forked by
/// the one spawner thread, see the module's documentation). For other test crates'
/// children too (the replica processes of node-sim).
pub fn spawn_tied(command: Command) -> io::Result<Child> {
    let gone = || io::Error::other("the kube-harness spawner thread is gone");
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()?.send((command, reply_tx)).map_err(|_| gone())?;
    reply_rx.recv().map_err(|_| gone())?
}

fn spawn_here(command: &mut Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    command.process_group(0);
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid) without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The parent died before prctl took effect: nobody would ever kill this child.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    command.spawn()
}

/// A child process that is killed (with everything in its process group) when dropped.
#[derive(Debug)]
pub struct Supervised {
    name: &'static str,
    child: Child,
    exited: Option<ExitStatus>,
    registration: Option<Registration>,
}

impl Supervised {
    /// Starts `command` like [`Supervised::spawn`] and registers it with `dir`, so that it is
    /// killed at exit even if this value is leaked.
    pub fn spawn_in(dir: &HarnessDir, name: &'static str, command: Command) -> io::Result<Self> {
        let mut child = Self::spawn(name, command)?;
        child.registration = Some(dir.register_pid(child.pid()));
        Ok(child)
    }

    /// Starts `command` in its own process group, tied to the life of this process.
    pub fn spawn(name: &'static str, command: Command) -> io::Result<Self> {
        let child = spawn_tied(command)?;
        Ok(Self {
            name,
            child,
            exited: None,
            registration: None,
        })
    }

    /// Short name used in messages (`etcd`, `kube-apiserver`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Process id, which is also its process group id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait()?;
            if self.exited.is_some() {
                self.registration.take();
            }
        }
        Ok(self.exited)
    }

    /// Kills the whole process group and reaps the child.
    pub fn kill(&mut self) {
        if self.exited.is_some() {
            // Already reaped: its pid may belong to someone else by now.
            return;
        }
        // SAFETY: plain syscall; the group id is our own unreaped child's pid, so it cannot
        // have been reused.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
        self.exited = self.child.wait().ok();
        // Reaped: the pid may be reused, so the exit handler must no longer kill it.
        self.registration.take();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a process with this pid exists (a zombie counts as gone).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        cond()
    }

    #[test]
    fn drop_kills_the_child_and_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 300 & echo $! > {}; wait", pidfile.display()));
        let child = Supervised::spawn("sh", cmd).unwrap();
        let pid = child.pid();
        assert!(pid_alive(pid));
        assert!(wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
        }));
        let grandchild: u32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(pid_alive(grandchild));
        drop(child);
        assert!(!pid_alive(pid));
        // The grandchild is not ours to reap; init does it once the group is killed.
        assert!(wait_until(Duration::from_secs(10), || !pid_alive(
            grandchild
        )));
    }

    #[test]
    fn children_spawned_from_short_lived_threads_survive_them() {
        let child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("300");
            Supervised::spawn("sleep", cmd).unwrap()
        })
        .join()
        .unwrap();
        // Had the short-lived thread forked it, PDEATHSIG would have fired when it ended.
        let mut child = child;
        assert!(!wait_until(Duration::from_millis(300), || child
            .exit_status()
            .unwrap()
            .is_some()));
        assert!(pid_alive(child.pid()));
    }

    #[test]
    fn an_exited_child_is_reported() {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("exit 7");
        let mut child = Supervised::spawn("sh", cmd).unwrap();
        assert!(wait_until(Duration::from_secs(10), || child
            .exit_status()
            .unwrap()
            .is_some()));
        assert_eq!(child.exit_status().unwrap().unwrap().code(), Some(7));
        child.kill();
        assert_eq!(child.name(), "sh");
    }
}
