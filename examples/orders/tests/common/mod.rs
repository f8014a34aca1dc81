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

/// A database created for one test on the PostgreSQL server of `DATABASE_URL`.
pub struct FreshPostgres {
    /// Its name.
    pub name: String,
    /// `DATABASE_URL` with the database replaced by this one (a query string, if any, kept).
    pub url: String,
    /// The connect options of `DATABASE_URL`, on this database.
    pub options: sqlx::postgres::PgConnectOptions,
}

/// Create a database named after `prefix` (see [`unique`]) on the server of `DATABASE_URL`.
pub async fn fresh_postgres(prefix: &str) -> FreshPostgres {
    use sqlx::{Connection, Executor};
    let url = std::env::var("DATABASE_URL").expect(
        "DATABASE_URL is not set: export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test",
    );
    let name = unique(prefix);
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at DATABASE_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!(r#"CREATE DATABASE "{name}""#)))
        .await
        .expect("create the test database");
    admin.close().await.ok();
    let options = url
        .parse::<sqlx::postgres::PgConnectOptions>()
        .expect("DATABASE_URL parses")
        .database(&name);
    let (without_query, query) = match url.split_once('?') {
        Some((u, q)) => (u, format!("?{q}")),
        None => (url.as_str(), String::new()),
    };
    let (server, _) = without_query
        .rsplit_once('/')
        .expect("DATABASE_URL ends with a database name");
    FreshPostgres {
        url: format!("{server}/{name}{query}"),
        name,
        options,
    }
}

/// A database created for one test on the MySQL (MariaDB) server of `MYSQL_URL`: its URL and
/// its connect options.
pub async fn fresh_mysql(prefix: &str) -> (String, sqlx::mysql::MySqlConnectOptions) {
    use sqlx::{Connection, Executor};
    let url = std::env::var("MYSQL_URL")
        .expect("MYSQL_URL is not set: export MYSQL_URL=mysql://root@127.0.0.1:3306/test");
    let name = unique(prefix);
    let mut admin = sqlx::MySqlConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach MySQL at MYSQL_URL={url}: {e}"));
    admin
        .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
        .await
        .expect("create the test database");
    admin.close().await.ok();
    let options = url
        .parse::<sqlx::mysql::MySqlConnectOptions>()
        .expect("MYSQL_URL parses")
        .database(&name);
    let (server, _) = url
        .split('?')
        .next()
        .and_then(|u| u.rsplit_once('/'))
        .expect("MYSQL_URL ends with a database name");
    (format!("{server}/{name}"), options)
}

/// The real binary on `database_url`, on a free port of 127.0.0.1, with its stdout piped for
/// [`listening_url`] and killed when the child is dropped; each test adds its own settings.
pub fn orders_api(database_url: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orders-api"));
    command
        .env("DATABASE_URL", database_url)
        .env("BIND_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}
