//! A throw-away database on the configured Postgres server: created for one
//! test or one QA run and dropped when it ends, pass or fail.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::Context;
use diesel::prelude::*;
use diesel::sql_types::BigInt;

use crate::db::{run_migrations, split_database_url};

/// A one-number answer: queries select it `AS n`.
#[derive(QueryableByName)]
pub struct Count {
    #[diesel(sql_type = BigInt)]
    pub n: i64,
}

/// Template creation and cloning are serialised across processes under this
/// advisory lock: `CREATE DATABASE ... TEMPLATE` fails while anyone else is
/// connected to the template.
const TEMPLATE_LOCK: i64 = 727274;

pub struct ScratchDb {
    pub url: String,
    server: String,
    name: String,
}

impl ScratchDb {
    /// A new, migrated database beside the one `database_url` names.
    pub fn create(database_url: &str, tag: &str) -> anyhow::Result<ScratchDb> {
        let db = ScratchDb::named(database_url, tag)?;
        db.recreate()?;
        Ok(db)
    }

    /// A copy of a migrated template: much faster than migrating, for suites
    /// that need hundreds of databases. The template is built on first use.
    pub fn cloned(database_url: &str, tag: &str) -> anyhow::Result<ScratchDb> {
        let db = ScratchDb::named(database_url, tag)?;
        let template = template_name()?;
        let mut admin = db.admin()?;
        diesel::sql_query(format!("SELECT pg_advisory_lock({TEMPLATE_LOCK})"))
            .execute(&mut admin)?;
        let cloned = build_template(&db.server, &template, &mut admin).and_then(|()| {
            diesel::sql_query(format!(
                "CREATE DATABASE \"{}\" TEMPLATE \"{template}\"",
                db.name
            ))
            .execute(&mut admin)?;
            Ok(())
        });
        diesel::sql_query(format!("SELECT pg_advisory_unlock({TEMPLATE_LOCK})"))
            .execute(&mut admin)?;
        cloned?;
        // A clone carries the template's Redis namespace; every database is a
        // deployment of its own, as a freshly migrated one would be.
        diesel::sql_query(
            "UPDATE deployment SET redis_namespace = substr(replace(gen_random_uuid()::text, '-', ''), 1, 16)",
        )
        .execute(&mut PgConnection::establish(&db.url)?)?;
        Ok(db)
    }

    fn named(database_url: &str, tag: &str) -> anyhow::Result<ScratchDb> {
        let (server, _) = split_database_url(database_url)?;
        let name = format!("flashsale_{tag}_{}", uuid::Uuid::new_v4().simple());
        Ok(ScratchDb {
            url: format!("{server}/{name}"),
            server,
            name,
        })
    }

    fn admin(&self) -> anyhow::Result<PgConnection> {
        crate::db::init_libpq();
        PgConnection::establish(&format!("{}/postgres", self.server))
            .with_context(|| format!("connecting to Postgres at {}", self.server))
    }

    /// Drops the database under whoever is using it: their connections are
    /// cut and new ones refused, as in an outage of this database alone.
    pub fn drop_database(&self) -> anyhow::Result<()> {
        diesel::sql_query(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&mut self.admin()?)?;
        Ok(())
    }

    /// Drops the database and migrates a new, empty one under the same name,
    /// as an operator's reset would; it gets a new Redis namespace.
    pub fn recreate(&self) -> anyhow::Result<()> {
        self.drop_database()?;
        diesel::sql_query(format!("CREATE DATABASE \"{}\"", self.name))
            .execute(&mut self.admin()?)?;
        run_migrations(&self.url)
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let _ = self.drop_database();
    }
}

fn build_template(server: &str, template: &str, admin: &mut PgConnection) -> anyhow::Result<()> {
    let exists: Count = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM pg_database WHERE datname = '{template}'"
    ))
    .get_result(admin)?;
    if exists.n > 0 {
        return Ok(());
    }
    // Built under another name and renamed when complete, so a run killed
    // half-way never leaves a template others would clone.
    let building = format!("{template}_building");
    diesel::sql_query(format!(
        "DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"
    ))
    .execute(admin)?;
    diesel::sql_query(format!("CREATE DATABASE \"{building}\"")).execute(admin)?;
    run_migrations(&format!("{server}/{building}"))?;
    diesel::sql_query(format!(
        "ALTER DATABASE \"{building}\" RENAME TO \"{template}\""
    ))
    .execute(admin)?;
    Ok(())
}

/// Keyed by the migrations' content, so a changed migration gets a new
/// template instead of a stale one.
fn template_name() -> anyhow::Result<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut files = Vec::new();
    walk(&dir, &mut files).with_context(|| format!("reading {}", dir.display()))?;
    files.sort();
    let mut hasher = DefaultHasher::new();
    for path in files {
        path.strip_prefix(&dir)?.to_string_lossy().hash(&mut hasher);
        std::fs::read(&path)?.hash(&mut hasher);
    }
    Ok(format!("flashsale_tpl_{:016x}", hasher.finish()))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}
