//! Binding listeners: what appears on the filesystem, and when.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

fn listener(socket: &Path, protocol: Protocol, mode: &str) -> ListenerConfig {
    ListenerConfig { protocol, socket: socket.to_path_buf(), socket_mode: mode.into(), ..ListenerConfig::default() }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("the socket exists").permissions().mode() & 0o777
}

/// Everything in `dir`, by name.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_socket_never_appears_at_its_path_with_a_mode_other_than_socket_mode() {
    // Another thread watches the path as fast as it can while the socket is bound again and again
    // (each bind replaces the stale socket of the previous one). Under a 022 umask a socket bound
    // in place starts as 0755: with the chmod after the bind, the watcher sees that mode now and
    // then; bound in a private directory and linked into place, never.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(metadata) = std::fs::symlink_metadata(&path) {
                    seen.insert(metadata.permissions().mode() & 0o777);
                }
            }
            seen
        })
    };
    for protocol in [Protocol::Lines, Protocol::Datagram] {
        for _ in 0..300 {
            let bound = Listener::bind("app", &listener(&path, protocol, "0600")).expect("bind");
            assert_eq!(mode_of(&path), 0o600);
            drop(bound);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().expect("watcher");
    assert_eq!(seen, [0o600].into(), "modes the watcher saw at {}", path.display());
}

#[tokio::test]
async fn binding_replaces_a_stale_socket_and_leaves_nothing_else_in_the_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.sock");
    // A socket file left behind by a crashed agent: bound, then closed without unlinking.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
    let bound = Listener::bind("app", &listener(&path, Protocol::Lines, "0640")).expect("bind over a stale socket");
    assert!(std::fs::symlink_metadata(&path).expect("socket").file_type().is_socket());
    assert_eq!(mode_of(&path), 0o640);
    assert_eq!(entries(dir.path()), ["app.sock"], "no temporary directory is left behind");
    // It is the listening socket: a writer reaches it at its final path.
    std::os::unix::net::UnixStream::connect(&path).expect("connect at the final path");
    drop(bound);
}

#[tokio::test]
async fn a_socket_in_use_is_neither_replaced_nor_bound_around() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.sock");
    let _running = Listener::bind("app", &listener(&path, Protocol::Lines, "0660")).expect("bind");
    let error = Listener::bind("again", &listener(&path, Protocol::Lines, "0660")).err().expect("in use");
    assert!(matches!(error, IngestError::InUse { .. }), "{error}");
    assert_eq!(entries(dir.path()), ["app.sock"]);
}

#[tokio::test]
async fn an_unknown_socket_group_fails_before_anything_appears_at_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.sock");
    let mut config = listener(&path, Protocol::Lines, "0660");
    config.socket_group = Some("no-such-group-sluice".into());
    let error = Listener::bind("app", &config).err().expect("unknown group");
    assert!(matches!(error, IngestError::UnknownGroup { .. }), "{error}");
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

#[tokio::test]
async fn the_socket_is_bound_in_a_private_directory_beside_its_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.sock");
    let listener = bind_private(&path, 0o660, None, |temporary| {
        let private = temporary.parent().expect("a directory");
        assert_eq!(private.parent(), Some(dir.path()), "the same directory, so the same filesystem");
        assert_eq!(mode_of(private), 0o700);
        assert!(!path.exists(), "nothing at the final path while the socket has the umask's mode");
        UnixListener::bind(temporary)
    })
    .expect("bound");
    assert_eq!(mode_of(&path), 0o660);
    assert_eq!(entries(dir.path()), ["app.sock"]);
    drop(listener);

    // A failed bind cleans up after itself too.
    std::fs::remove_file(&path).expect("remove");
    let failed = bind_private(&path, 0o660, None, |_| -> io::Result<UnixListener> { Err(io::Error::other("no")) });
    assert!(failed.is_err());
    assert!(entries(dir.path()).is_empty(), "{:?}", entries(dir.path()));
}

#[tokio::test]
async fn whatever_reaches_the_path_while_the_socket_is_bound_is_never_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.sock");
    let failed = bind_private(&path, 0o660, None, |temporary| {
        // Created after the stale-socket check looked: rename() would silently replace it.
        std::fs::write(&path, "precious").expect("write");
        UnixListener::bind(temporary)
    });
    assert_eq!(failed.err().map(|error| error.kind()), Some(io::ErrorKind::AlreadyExists));
    assert_eq!(std::fs::read_to_string(&path).expect("still there"), "precious");
    assert_eq!(entries(dir.path()), ["app.sock"], "and the private directory is gone");
}
