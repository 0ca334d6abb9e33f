//! What the benchmark reads about processes and the machine: CPU time and memory of a pid from
//! `/proc`, the clock tick, wall-clock time, the machine's one-line description.
//!
//! Owns: those readings. Must not: change anything (no signals, no files written).

/// Wall-clock seconds since the epoch (`date +%s.%N`): phases and samples are timed by it.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// User + system CPU time of `pid`, in clock ticks (`/proc/PID/stat` fields 14 and 15).
pub fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|value| value.parse::<u64>().ok()).unwrap_or(0);
    field(14) + field(15)
}

/// A `Vm…` line of `/proc/PID/status`, in KiB (0 when the process is gone).
fn status_kib(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of `pid` now (`VmRSS`), KiB.
pub fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// Peak resident memory of `pid` (`VmHWM`), KiB.
pub fn hwm_kib(pid: i32) -> u64 {
    status_kib(pid, "VmHWM")
}

/// The output of a command, trimmed (empty if it cannot run).
fn output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 if it does not answer).
pub fn clock_ticks() -> u64 {
    output("getconf", &["CLK_TCK"]).parse().unwrap_or(100)
}

/// "2 cores, 24 GiB, Linux 6.1.0": `nproc`, MemTotal, `uname -sr`.
pub fn machine() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total_kib: f64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    format!("{} cores, {:.0} GiB, {}", output("nproc", &[]), total_kib / 1_048_576.0, output("uname", &["-sr"]))
}

/// The first line of `rsyslogd -v`, second word: its version.
pub fn rsyslog_version(rsyslogd: &str) -> String {
    let version = output(rsyslogd, &["-v"]);
    version.lines().next().and_then(|line| line.split_whitespace().nth(1)).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id() as i32;
        let spin: u64 = (0..5_000_000u64).fold(0, |sum, n| sum.wrapping_add(n * n));
        assert!(spin > 0);
        assert!(rss_kib(pid) > 0 && hwm_kib(pid) >= rss_kib(pid));
        let _ = cpu_ticks(pid);
        assert_eq!(rss_kib(i32::MAX), 0, "a pid that does not exist reads 0");
        assert!(machine().contains(" cores, "));
    }
}
