//! The table a SQL store keeps its records in: [`TableName`], checked once, and the store's
//! statements written for it once, when the store is built.

use std::{fmt, str::FromStr, sync::Arc};

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// The name every statement and migration of the SQL stores is written with, and the table they
/// use unless the store's `with_table` names another.
const DEFAULT: &str = "idempotency_records";

/// The longest name part: the store derives index, constraint and migration-table names from
/// it (`{name}_expires_at`, `{name}_migrations`), and those must fit PostgreSQL's 63 bytes.
const MAX_NAME: usize = 52;

/// The longest schema part (PostgreSQL's and MySQL's identifier limit).
const MAX_SCHEMA: usize = 63;

/// The table of a SQL store: `name` or `schema.name`, each part ASCII letters, digits and `_`,
/// not starting with a digit. Anything else is refused with [`InvalidTableName`], so the name can
/// be written into the store's SQL as it is.
///
/// The name is written unquoted: PostgreSQL folds it to lower case, MySQL compares it as its
/// `lower_case_table_names` says. The schema must exist (for SQLite, an attached database; for
/// MySQL, a database).
///
/// A store's `with_table` writes every statement, batched or not, for the table once, when the
/// store is built: a request runs the same prepared statements as on the default table, and
/// nothing is formatted per request. `migrate()` creates the table, with its index and
/// constraints named after it (`{name}_expires_at`), and tracks its migrations in
/// `{table}_migrations` (the default table keeps `_tower_idempotency_migrations`), so stores on
/// two tables of one database migrate apart. `check_schema()` names the table it checks.
///
/// With your own migration tool, apply the files of `migrations/` with the name written in. For
/// a name without a schema, replace `idempotency_records` by it. For `schema.name`, first
/// replace `idempotency_records_`, the start of the index and constraint names, by `name_`
/// (SQLite: by `schema.name_`, since its index names carry the schema), and `ON
/// idempotency_records (` by `ON name (` (SQLite only: an index is created in its table's
/// schema); then every other `idempotency_records` by `schema.name`. PostgreSQL and MySQL create
/// indexes and constraints in their table's schema and refuse a schema in their names.
///
/// ```
/// use tower_idempotency::store::TableName;
///
/// let table: TableName = "billing.idempotency_keys".parse().unwrap();
/// assert_eq!(table.as_str(), "billing.idempotency_keys");
/// assert_eq!(TableName::default().as_str(), "idempotency_records");
/// assert!(TableName::new("records; DROP TABLE users").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(Arc<str>);

/// Why a [`TableName`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {name:?}: {reason}")]
pub struct InvalidTableName {
    name: String,
    reason: &'static str,
}

impl TableName {
    /// `table` (`name` or `schema.name`), if it is a plain SQL identifier.
    pub fn new(table: &str) -> Result<Self, InvalidTableName> {
        let refuse = |reason| InvalidTableName {
            name: table.to_owned(),
            reason,
        };
        let (schema, name) = match table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, table),
        };
        if let Some(schema) = schema {
            check_part(schema, MAX_SCHEMA).map_err(refuse)?;
        }
        check_part(name, MAX_NAME).map_err(refuse)?;
        Ok(Self(table.into()))
    }

    /// The name as written into the SQL: `name` or `schema.name`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The schema part, if any.
    fn schema(&self) -> Option<&str> {
        self.0.split_once('.').map(|(schema, _)| schema)
    }

    /// The name without its schema.
    fn name(&self) -> &str {
        self.0.split_once('.').map_or(&self.0, |(_, name)| name)
    }

    fn is_default(&self) -> bool {
        &*self.0 == DEFAULT
    }

    /// `template` (SQL written for the default table) for this table. For the default table it
    /// is the template itself, with no copy; otherwise a shared copy, made once: cloning the
    /// returned statement for each execution costs a reference count, never an allocation.
    pub(in crate::store) fn statement(&self, template: &'static str) -> SqlStr {
        if self.is_default() {
            return template.into_sql_str();
        }
        let sql: Arc<str> = template.replace(DEFAULT, self.as_str()).into();
        AssertSqlSafe(sql).into_sql_str()
    }

    /// `sql`, written for the default table, for this table: made once, when a store is built.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(in crate::store) fn statement_text(&self, sql: String) -> SqlStr {
        let sql: Arc<str> = if self.is_default() {
            sql.into()
        } else {
            sql.replace(DEFAULT, self.as_str()).into()
        };
        AssertSqlSafe(sql).into_sql_str()
    }

    /// A migration (SQL written for the default table) for this table: the table's name
    /// where the table is meant, and the names derived from it (`{name}_expires_at`, the
    /// constraints) where an index or constraint is named. SQLite names an index with its
    /// schema and the table it indexes without one.
    pub(in crate::store) fn migration(&self, template: &str, sqlite: bool) -> String {
        if self.is_default() {
            return template.to_owned();
        }
        let derived = if sqlite { self.as_str() } else { self.name() };
        let indexed = format!("ON {} (", self.name());
        let sql = if sqlite {
            template.replace(&format!("ON {DEFAULT} ("), &indexed)
        } else {
            template.to_owned()
        };
        sql.replace(&format!("{DEFAULT}_"), &format!("{derived}_"))
            .replace(DEFAULT, self.as_str())
    }

    /// The table the store's migrations for this table are tracked in: the crate's own
    /// (`_tower_idempotency_migrations`) for the default table, `{schema.}{name}_migrations`
    /// for another, so that stores on two tables of one database migrate apart.
    pub(in crate::store) fn migrations_table(&self) -> String {
        if self.is_default() {
            return super::MIGRATIONS_TABLE.to_owned();
        }
        match self.schema() {
            Some(schema) => format!("{schema}.{}_migrations", self.name()),
            None => format!("{}_migrations", self.name()),
        }
    }
}

/// One part of a table name: ASCII letters, digits and `_`, not starting with a digit, at most
/// `max` bytes.
fn check_part(part: &str, max: usize) -> Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("a name part is empty"),
        Some(c) if c.is_ascii_digit() => return Err("a name part starts with a digit"),
        Some(_) => {}
    }
    if !part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and `_` are allowed, with one `.` before the table for a schema");
    }
    if part.len() > max {
        return Err("a name part is too long (the table's name at most 52 bytes, its schema 63)");
    }
    Ok(())
}

impl Default for TableName {
    /// `idempotency_records`, the table of the migrations in the repository's `migrations/`.
    fn default() -> Self {
        Self(DEFAULT.into())
    }
}

impl FromStr for TableName {
    type Err = InvalidTableName;

    fn from_str(table: &str) -> Result<Self, Self::Err> {
        Self::new(table)
    }
}

impl TryFrom<&str> for TableName {
    type Error = InvalidTableName;

    fn try_from(table: &str) -> Result<Self, Self::Error> {
        Self::new(table)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({})", self.0)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_identifiers_with_an_optional_schema_are_accepted() {
        for ok in ["idempotency_records", "_keys", "Keys2", "billing.keys", "a"] {
            assert_eq!(TableName::new(ok).unwrap().as_str(), ok);
        }
        assert_eq!(
            TableName::new(&"k".repeat(MAX_NAME)).unwrap().name().len(),
            MAX_NAME
        );
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        let refused = [
            "",
            ".keys",
            "billing.",
            "a.b.c",
            "2keys",
            "keys; DROP TABLE users",
            "\"keys\"",
            "ke-ys",
            "kéys",
            "keys ",
        ];
        for bad in refused {
            let err = TableName::new(bad).unwrap_err();
            assert!(err.to_string().starts_with("invalid table name"), "{err}");
        }
        assert!(TableName::new(&"k".repeat(MAX_NAME + 1)).is_err());
    }

    #[test]
    fn statements_name_the_table_and_the_default_is_not_copied() {
        let template: &'static str = "DELETE FROM idempotency_records WHERE x";
        let default = TableName::default().statement(template);
        // The template itself, not a copy of its text.
        assert!(std::ptr::eq(default.as_str(), template));
        let other = TableName::new("billing.keys").unwrap();
        let statement = other.statement("SELECT 1 FROM idempotency_records AS r");
        assert_eq!(statement.as_str(), "SELECT 1 FROM billing.keys AS r");
        // A shared copy: a clone is the same text in the same place.
        assert!(std::ptr::eq(statement.as_str(), statement.clone().as_str()));
    }

    #[test]
    fn migrations_name_the_table_and_its_index() {
        let index = "CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);";
        let table = TableName::new("billing.keys").unwrap();
        assert_eq!(
            table.migration(index, false),
            "CREATE INDEX IF NOT EXISTS keys_expires_at ON billing.keys (expires_at);"
        );
        assert_eq!(
            table.migration(index, true),
            "CREATE INDEX IF NOT EXISTS billing.keys_expires_at ON keys (expires_at);"
        );
        assert_eq!(table.migrations_table(), "billing.keys_migrations");
        assert_eq!(
            TableName::default().migrations_table(),
            "_tower_idempotency_migrations"
        );
    }
}
