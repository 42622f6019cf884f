//! CPU time of a process (every thread of it), from /proc/<pid>/stat. The convergence
//! stage reads it for etcd and for this process (the operator, the simulators and the
//! node simulation): with the API server's, that is where each phase's CPU went on a
//! machine they all share.

use anyhow::{Context as _, Result};

/// CPU seconds (user + system, every thread) process `pid` has used so far.
pub fn cpu_seconds_of(pid: u32) -> Result<f64> {
    read(&format!("/proc/{pid}/stat"))
}

/// CPU seconds (user + system, every thread) this process has used so far.
pub fn own_cpu_seconds() -> Result<f64> {
    read("/proc/self/stat")
}

fn read(stat_file: &str) -> Result<f64> {
    let stat =
        std::fs::read_to_string(stat_file).with_context(|| format!("cannot read {stat_file}"))?;
    let ticks = user_and_system_ticks(&stat)
        .with_context(|| format!("{stat_file} has no utime and stime fields"))?;
    Ok(ticks as f64 / ticks_per_second()?)
}

/// utime + stime of a /proc/<pid>/stat line, in clock ticks. The second field (the
/// command) is in parentheses and may hold spaces and parentheses itself, so the fields
/// are counted from the last `)`: the third field (state) is the first after it, utime
/// the 14th and stime the 15th.
fn user_and_system_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The kernel's clock ticks per second for /proc times (`USER_HZ`).
fn ticks_per_second() -> Result<f64> {
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    anyhow::ensure!(hz > 0, "sysconf(_SC_CLK_TCK) answered {hz}");
    Ok(hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis of its own (as a thread may name
        // itself); utime 1234, stime 56.
        let stat = "4242 (tokio (rt) w) S 1 4242 4242 0 -1 4194560 5000 0 3 0 1234 56 0 0 20 0 9 0 100 1000 200";
        assert_eq!(user_and_system_ticks(stat), Some(1290));
        assert_eq!(user_and_system_ticks("4242 (cut short) S 1 2"), None);
        assert_eq!(user_and_system_ticks("no parenthesis at all"), None);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        let spent = own_cpu_seconds().expect("own /proc stat");
        // Busy for a moment, so the clock ticks at least once whatever ran before.
        let began = std::time::Instant::now();
        let mut x = 0u64;
        while began.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(own_cpu_seconds().expect("own /proc stat") > spent);
        assert!(cpu_seconds_of(u32::MAX).is_err());
    }
}
