//! What the tests of the orders API share: the real `orders_api::app` on a fresh
//! SQLite file, served over a real TCP listener on 127.0.0.1, and the helpers of the tests that
//! spawn the real binary.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::net::SocketAddr;

use orders_api::{Config, Db};

/// Serve the app on a fresh SQLite file whose name starts with `label`; its address and database.
pub async fn serve_on_fresh_sqlite(label: &str) -> (SocketAddr, Db) {
    let path = std::env::temp_dir().join(format!(
        "{label}_{}_{}.db",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let db = Db::connect(Some(&format!("sqlite://{}", path.display())))
        .await
        .expect("open a fresh SQLite file");
    db.migrate().await.expect("migrate");
    let app = orders_api::app(db.clone(), Config::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, db)
}

/// A name no other test run uses: `prefix`, this process, a random part.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Wait (up to 60 s) for the spawned binary's `listening on http://ADDR` line and return the
/// URL; its stdout is drained after, so the child never blocks on a full pipe.
pub async fn listening_url(child: &mut tokio::process::Child) -> String {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let stdout = child.stdout.take().expect("the binary's stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let url = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the binary's stdout") {
            if let Some(url) = line.strip_prefix("listening on ") {
                return url.trim().to_owned();
            }
        }
        panic!("the binary exited before printing `listening on`");
    })
    .await
    .expect("the binary printed `listening on` within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    url
}
