//! A TCP proxy a test can cut: it stands in for PostgreSQL so one test can take "the database"
//! away from its persister without stopping the server the other tests use.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct Proxy {
    pub address: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: AbortHandle,
}

#[derive(Default)]
struct State {
    cut: bool,
    connections: Vec<AbortHandle>,
}

impl Proxy {
    /// Forwards 127.0.0.1:<free port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let address = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if shared.lock().expect("proxy state").cut {
                    continue; // dropped: the client sees the connection closed
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                shared.lock().expect("proxy state").connections.push(task.abort_handle());
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
            connection.abort();
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.state.lock().expect("proxy state").cut = false;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
