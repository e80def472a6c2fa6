//! Where the tables live: the Delta root (a URL such as `abfss://…`, or a local directory) and
//! one directory per table below it.

use std::path::Path;

use url::Url;

use crate::error::HistoryError;
use crate::tables::Table;

/// The URL of the Delta root: a URL with a scheme, or a local directory (created if missing).
/// `az://` and `azure://` roots are refused: with them delta-rs' Azure store drops the first path
/// segment below the container (a table at `az://c/delta/events` lands at `c/events`, one at
/// `az://c/events` at the container's root, where the tables would collide — seen on Azurite);
/// `abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH` keeps every segment.
pub fn root_url(root: &str) -> Result<Url, HistoryError> {
    let invalid = |reason: String| HistoryError::Location {
        root: root.to_owned(),
        reason,
    };
    let scheme = root
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    if matches!(scheme.as_deref(), Some("az" | "azure")) {
        return Err(invalid(
            "az:// paths lose their first segment in delta-rs' Azure store, so the tables would \
             not be where they are read; write abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH"
                .to_owned(),
        ));
    }
    if root.contains("://") {
        let mut url = Url::parse(root).map_err(|error| invalid(error.to_string()))?;
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        return Ok(url);
    }
    let path = Path::new(root);
    std::fs::create_dir_all(path).map_err(|error| invalid(format!("cannot create it: {error}")))?;
    let absolute = path
        .canonicalize()
        .map_err(|error| invalid(format!("cannot resolve it: {error}")))?;
    Url::from_directory_path(&absolute).map_err(|()| invalid("not an absolute path".to_owned()))
}

/// The URL of one table below the root.
pub fn table_url(root: &Url, table: Table) -> Result<Url, HistoryError> {
    root.join(&format!("{}/", table.name()))
        .map_err(|error| HistoryError::Location {
            root: root.to_string(),
            reason: format!("table {}: {error}", table.name()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_root_gets_a_trailing_slash_and_tables_sit_below_it() {
        let root = root_url("abfss://history@account.dfs.core.windows.net/contrail").expect("root");
        assert_eq!(
            root.as_str(),
            "abfss://history@account.dfs.core.windows.net/contrail/"
        );
        let events = table_url(&root, Table::Events).expect("table");
        assert_eq!(
            events.as_str(),
            "abfss://history@account.dfs.core.windows.net/contrail/events/"
        );
    }

    #[test]
    fn a_local_root_is_created_and_made_absolute() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("nested/history");
        let url = root_url(&root.display().to_string()).expect("root");
        assert!(root.is_dir());
        assert_eq!(url.scheme(), "file");
        assert!(url.path().ends_with("/nested/history/"), "{url}");
    }

    #[test]
    fn az_roots_are_refused_with_the_form_that_works() {
        for root in [
            "az://contrail-delta/",
            "AZ://history/delta",
            "azure://history/delta",
        ] {
            let error = root_url(root).expect_err(root).to_string();
            assert!(
                error.contains(root) && error.contains("abfss://CONTAINER@"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_malformed_url_names_the_root() {
        let error = root_url("abfss://[bad").expect_err("malformed");
        assert!(error.to_string().contains("abfss://[bad"), "{error}");
    }
}
