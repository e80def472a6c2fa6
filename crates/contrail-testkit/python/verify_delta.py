"""Independent reader of contrail's Delta tables (delta-rs' Python binding + polars).

usage: verify_delta.py ROOT SPEC.json

ROOT is a local directory or a URL (abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH); for a URL
the environment gives the storage options as JSON in CONTRAIL_VERIFY_STORAGE_OPTIONS, and the
Parquet files are counted by listing the container with azure-storage-blob at
CONTRAIL_VERIFY_BLOB_ACCOUNT_URL (Azurite: http://127.0.0.1:PORT/devstoreaccount1).

SPEC maps a table name to {"identity": [columns], "expected": FILE, "app_ids": [...]}; FILE holds
one expected identity per line (the identity columns joined with '#'). Prints one JSON object:
per table the row count, distinct identities, how many expected identities are missing, how many
rows are not expected, samples of both, the stored txn version of every app id, the number of
files in the table's snapshot, the Parquet files on disk, and the table version.
"""

import json
import os
import sys

import polars as pl
from deltalake import DeltaTable


def main() -> None:
    root, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    remote = "://" in root
    options = json.loads(os.environ.get("CONTRAIL_VERIFY_STORAGE_OPTIONS", "{}")) if remote else None
    report = {}
    for table, wanted in spec.items():
        path = f"{root.rstrip('/')}/{table}" if remote else os.path.join(root, table)
        delta = DeltaTable(path, storage_options=options)
        frame = pl.read_delta(path, storage_options=options)
        identity = frame.select(
            pl.concat_str(
                [pl.col(column).cast(pl.Utf8) for column in wanted["identity"]],
                separator="#",
            ).alias("identity")
        )["identity"]
        with open(wanted["expected"], encoding="utf-8") as handle:
            expected = {line for line in handle.read().split("\n") if line}
        found = set(identity.to_list())
        on_disk = 0
        if remote:
            on_disk = sum(1 for name in blob_names(root, options, table) if name.endswith(".parquet"))
        for directory, _, names in os.walk(path) if not remote else []:
            if "_delta_log" not in directory:
                on_disk += sum(1 for name in names if name.endswith(".parquet"))
        report[table] = {
            "rows": frame.height,
            "distinct": identity.n_unique(),
            "missing": len(expected - found),
            "unexpected": len(found - expected),
            "missing_sample": sorted(expected - found)[:5],
            "unexpected_sample": sorted(found - expected)[:5],
            "txn": {app_id: delta.transaction_version(app_id) for app_id in wanted["app_ids"]},
            "files": len(delta.files()),
            "parquet_on_disk": on_disk,
            "version": delta.version(),
            "partitions": frame.select(pl.col(wanted["partition"]).n_unique()).item(),
        }
    print(json.dumps(report))


def blob_names(root: str, options: dict, table: str) -> list[str]:
    """The blobs below ROOT/TABLE (outside _delta_log), listed with Microsoft's client."""
    from urllib.parse import urlparse

    from azure.storage.blob import ContainerClient

    parsed = urlparse(root)
    container = parsed.username or parsed.netloc
    prefix = f"{parsed.path.strip('/')}/{table}/".lstrip("/")
    client = ContainerClient(
        account_url=os.environ["CONTRAIL_VERIFY_BLOB_ACCOUNT_URL"],
        container_name=container,
        credential={"account_name": options["account_name"], "account_key": options["account_key"]},
    )
    return [blob.name for blob in client.list_blobs(name_starts_with=prefix) if "/_delta_log/" not in blob.name]


if __name__ == "__main__":
    main()
