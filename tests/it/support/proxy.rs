//! A TCP proxy a test can cut or hold: it stands in for PostgreSQL so one test can take "the
//! database" away from its persister without stopping the server the other tests use, and for a
//! private Kafka broker ([`PrivateBroker::behind_proxy`](super::PrivateBroker::behind_proxy)) so
//! a test can hold the broker's answers while its requests still reach it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub struct Proxy {
    pub address: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: AbortHandle,
}

#[derive(Default)]
struct State {
    cut: bool,
    connections: Vec<Connection>,
}

struct Connection {
    task: AbortHandle,
    /// True while the upstream's bytes are held back from the client.
    held: watch::Sender<bool>,
}

impl Proxy {
    /// Forwards 127.0.0.1:<free port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let address = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if shared.lock().expect("proxy state").cut {
                    continue; // dropped: the client sees the connection closed
                }
                let (held, hold) = watch::channel(false);
                let task = tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        forward(client, server, hold).await;
                    }
                });
                shared.lock().expect("proxy state").connections.push(Connection { task: task.abort_handle(), held });
            }
        })
        .abort_handle();
        Self { address, state, accept }
    }

    /// Closes every connection and refuses new ones, like a database that went away.
    pub fn cut(&self) {
        let mut state = self.state.lock().expect("proxy state");
        state.cut = true;
        for connection in state.connections.drain(..) {
            connection.task.abort();
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.state.lock().expect("proxy state").cut = false;
    }

    /// Holds back what the upstream sends on every connection open now (their requests still go
    /// through): a server that did the work but whose answers are slow to come. Connections
    /// opened later are not held.
    pub fn hold_answers(&self) {
        for connection in &self.state.lock().expect("proxy state").connections {
            connection.held.send_replace(true);
        }
    }

    /// Lets the held answers through, and everything after them.
    pub fn release_answers(&self) {
        for connection in &self.state.lock().expect("proxy state").connections {
            connection.held.send_replace(false);
        }
    }
}

/// Copies both ways until either side closes; the upstream's bytes wait while `hold` says so.
async fn forward(client: TcpStream, server: TcpStream, mut hold: watch::Receiver<bool>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::io::copy(&mut client_read, &mut server_write);
    let answers = async {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = server_read.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            // Held: the bytes wait here (one chunk; the upstream's socket buffer holds the rest).
            if hold.wait_for(|held| !held).await.is_err() {
                return Ok(());
            }
            client_write.write_all(&chunk[..n]).await?;
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = answers => {}
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
