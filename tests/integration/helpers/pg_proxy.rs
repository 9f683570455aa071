//! A Postgres wire-protocol proxy in front of the real server, to make a
//! COMMIT's outcome uncertain on purpose: it lets the COMMIT reach the
//! server, waits until the server has carried it out, and then cuts the
//! client off without relaying the answer. A real network drop can do the
//! same, but not on demand.
//!
//! It answers the client's SSLRequest (and GSSENCRequest) with 'N' itself,
//! so the stream stays plaintext and its messages can be read.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

#[derive(Default)]
struct Shared {
    /// Cut the next COMMIT of a transaction that wrote an order.
    armed: AtomicBool,
    /// After that cut, also sever every connection and refuse new ones,
    /// until `restore`: the shop cannot look anything up meanwhile.
    then_down: AtomicBool,
    /// Roll the transaction back instead of committing it.
    drop_commit: AtomicBool,
    cuts: AtomicUsize,
}

pub struct PgProxy {
    pub port: u16,
    shared: Arc<Shared>,
    down: watch::Sender<bool>,
}

impl PgProxy {
    /// A proxy on a free local port in front of `upstream` ("host:port").
    pub async fn start(upstream: &str) -> PgProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let (down, _) = watch::channel(false);
        let (upstream, accept_shared, accept_down) =
            (upstream.to_string(), shared.clone(), down.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *accept_down.borrow() {
                    continue;
                }
                let (upstream, shared, down) =
                    (upstream.clone(), accept_shared.clone(), accept_down.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = relay(client, server, shared, down).await;
                    }
                });
            }
        });
        PgProxy { port, shared, down }
    }

    /// `database_url` with its host and port replaced by this proxy's.
    pub fn url_for(&self, database_url: &str) -> String {
        let (scheme, rest) = database_url.split_once("://").unwrap();
        let (authority, path) = rest.split_once('/').unwrap();
        let credentials = authority
            .rsplit_once('@')
            .map(|(c, _)| format!("{c}@"))
            .unwrap_or_default();
        format!("{scheme}://{credentials}127.0.0.1:{}/{path}", self.port)
    }

    /// Cuts the answer to the next COMMIT of a transaction that inserted an
    /// order; with `then_down`, the database also stays unreachable through
    /// this proxy from then on, until `restore`.
    pub fn cut_next_order_commit(&self, then_down: bool) {
        self.shared.drop_commit.store(false, Ordering::SeqCst);
        self.shared.then_down.store(then_down, Ordering::SeqCst);
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// Like `cut_next_order_commit(true)`, but the server is told ROLLBACK
    /// instead, so nothing is bought; the shop cannot tell the difference.
    pub fn drop_next_order_commit(&self) {
        self.shared.drop_commit.store(true, Ordering::SeqCst);
        self.shared.then_down.store(true, Ordering::SeqCst);
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// How many COMMITs were carried out with their answer cut.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    pub fn restore(&self) {
        self.down.send_replace(false);
    }
}

/// One frontend or backend message after start-up: its type and its body.
async fn read_message(stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u8, Vec<u8>)> {
    let kind = stream.read_u8().await?;
    let len = stream.read_u32().await? as usize;
    let mut body = vec![0; len.saturating_sub(4)];
    stream.read_exact(&mut body).await?;
    Ok((kind, body))
}

async fn write_message(
    stream: &mut (impl AsyncWrite + Unpin),
    kind: u8,
    body: &[u8],
) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.push(kind);
    frame.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    frame.extend_from_slice(body);
    stream.write_all(&frame).await
}

/// The NUL-terminated string at the start of `bytes`, and what follows it.
fn c_string(bytes: &[u8]) -> (&str, &[u8]) {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let rest = bytes.get(end + 1..).unwrap_or(&[]);
    (std::str::from_utf8(&bytes[..end]).unwrap_or(""), rest)
}

fn writes_an_order(sql: &str) -> bool {
    sql.to_ascii_uppercase().contains("INSERT INTO ORDERS")
}

async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    shared: Arc<Shared>,
    down: watch::Sender<bool>,
) -> std::io::Result<()> {
    // Start-up packets carry no type byte. Refuse encryption ourselves.
    let startup = loop {
        let len = client.read_u32().await? as usize;
        let mut body = vec![0; len.saturating_sub(4)];
        client.read_exact(&mut body).await?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            client.write_all(b"N").await?;
            continue;
        }
        let mut packet = (len as u32).to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        break packet;
    };
    server.write_all(&startup).await?;

    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let cutting = Arc::new(AtomicBool::new(false));
    let commit_done = Arc::new(Notify::new());
    let mut severed = down.subscribe();

    let (relay_cutting, relay_done) = (cutting.clone(), commit_done.clone());
    let to_client = async move {
        loop {
            let (kind, body) = match read_message(&mut server_read).await {
                Ok(message) => message,
                Err(error) => return Err::<(), std::io::Error>(error),
            };
            if relay_cutting.load(Ordering::SeqCst) {
                // ReadyForQuery: the server has carried the COMMIT out.
                if kind == b'Z' {
                    relay_done.notify_one();
                    std::future::pending::<()>().await;
                }
                continue;
            }
            write_message(&mut client_write, kind, &body).await?;
        }
    };

    let to_server = async move {
        let mut statements_writing_orders: Vec<String> = Vec::new();
        let mut wrote_order = false;
        loop {
            let (kind, body) = read_message(&mut client_read).await?;
            match kind {
                // Parse: name, SQL text.
                b'P' => {
                    let (name, rest) = c_string(&body);
                    let (sql, _) = c_string(rest);
                    if writes_an_order(sql) {
                        wrote_order = true;
                        statements_writing_orders.push(name.to_string());
                    }
                }
                // Bind: portal, statement name (a cached statement is not parsed again).
                b'B' => {
                    let (_, rest) = c_string(&body);
                    let (statement, _) = c_string(rest);
                    if statements_writing_orders.iter().any(|s| s == statement) {
                        wrote_order = true;
                    }
                }
                b'Q' => {
                    let (sql, _) = c_string(&body);
                    let sql = sql.trim().trim_end_matches(';').to_ascii_uppercase();
                    if writes_an_order(&sql) {
                        wrote_order = true;
                    }
                    if sql == "COMMIT" || sql == "ROLLBACK" {
                        let cut = sql == "COMMIT"
                            && wrote_order
                            && shared.armed.swap(false, Ordering::SeqCst);
                        wrote_order = false;
                        if cut {
                            cutting.store(true, Ordering::SeqCst);
                            if shared.drop_commit.load(Ordering::SeqCst) {
                                write_message(&mut server_write, b'Q', b"ROLLBACK\0").await?;
                            } else {
                                write_message(&mut server_write, kind, &body).await?;
                            }
                            let _ = tokio::time::timeout(
                                Duration::from_secs(5),
                                commit_done.notified(),
                            )
                            .await;
                            shared.cuts.fetch_add(1, Ordering::SeqCst);
                            if shared.then_down.load(Ordering::SeqCst) {
                                down.send_replace(true);
                            }
                            return Ok::<(), std::io::Error>(());
                        }
                    }
                }
                _ => {}
            }
            write_message(&mut server_write, kind, &body).await?;
        }
    };

    tokio::select! {
        result = to_client => result,
        result = to_server => result,
        _ = severed.wait_for(|down| *down) => Ok(()),
    }
}
