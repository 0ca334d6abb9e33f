//! Real clients of the ingest protocols, as apps would use them: util-linux `logger`, Python's
//! `logging.handlers.SysLogHandler`, and Python's `fluent-logger` (from the virtualenv
//! `scripts/tools python` builds; `SLUICE_PYTHON` names its interpreter).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The Python interpreter of the tools virtualenv (it has `fluent-logger`).
pub fn python() -> PathBuf {
    std::env::var_os("SLUICE_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        home.join(".cache/sluice/tools/python/bin/python")
    })
}

fn run(mut command: Command, what: &str) -> Output {
    let output = command.output().unwrap_or_else(|error| panic!("cannot run {what} ({error})"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `logger -u SOCKET ARGS… MESSAGE` (util-linux; `scripts/test` installs it if missing).
pub fn logger(socket: &Path, args: &[&str], message: &str) {
    let mut command = Command::new("logger");
    command.arg("-u").arg(socket).args(args).arg(message);
    run(command, "logger (install util-linux's bsdutils)");
}

/// Runs a Python program with `args`; its stdout.
pub fn python_script(program: &str, args: &[&str]) -> String {
    let mut command = Command::new(python());
    command.arg("-c").arg(program).args(args);
    let output = run(command, "the tools' python (run `scripts/tools python` or set SLUICE_PYTHON)");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Python's stdlib `SysLogHandler` pointed at `socket`, logging `message` at ERROR.
pub fn python_syslog_handler(socket: &Path, message: &str) {
    let program = r#"
import logging, logging.handlers, sys
handler = logging.handlers.SysLogHandler(address=sys.argv[1])
log = logging.getLogger("app")
log.addHandler(handler)
log.error(sys.argv[2])
handler.close()
"#;
    python_script(program, &[socket.to_str().expect("utf-8 path"), message]);
}

/// Python `fluent-logger` with `require_ack_response`: emits `count` events tagged `app.web`,
/// each `{"message": "fluent N", "level": "info", "n": N}`, and fails unless every emit was
/// acknowledged.
pub fn fluent_logger(socket: &Path, count: usize) {
    let program = r#"
import sys
from fluent import sender
log = sender.FluentSender("app", host="unix://" + sys.argv[1], require_ack_response=True,
                          nanosecond_precision=True, timeout=20)
for n in range(int(sys.argv[2])):
    if not log.emit("web", {"message": "fluent %d" % n, "level": "info", "n": n}):
        sys.exit("emit %d failed: %r" % (n, log.last_error))
log.close()
"#;
    python_script(program, &[socket.to_str().expect("utf-8 path"), &count.to_string()]);
}
