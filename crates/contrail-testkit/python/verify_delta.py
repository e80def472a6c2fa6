"""Independent reader of contrail's Delta tables (delta-rs' Python binding + polars).

usage: verify_delta.py ROOT SPEC.json

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
    report = {}
    for table, wanted in spec.items():
        path = os.path.join(root, table)
        delta = DeltaTable(path)
        frame = pl.read_delta(path)
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
        for directory, _, names in os.walk(path):
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


if __name__ == "__main__":
    main()
