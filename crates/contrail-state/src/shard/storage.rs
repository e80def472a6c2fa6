//! RocksDB options of a shard and the memory the shards of a process share.

use rocksdb::Options;

pub(super) fn options(memory: Option<&StorageMemory>) -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    options.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Most point reads miss (a new flight's state, an event id never seen): bloom filters answer
    // a miss without searching each memtable and SST file.
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table.set_whole_key_filtering(true);
    if let Some(memory) = memory {
        table.set_block_cache(&memory.block_cache);
        options.set_write_buffer_manager(&memory.memtables);
    }
    options.set_block_based_table_factory(&table);
    options.set_memtable_whole_key_filtering(true);
    options.set_memtable_prefix_bloom_ratio(0.02);
    options
}

/// RocksDB memory that the shards of one process share: one block cache (SST data blocks read
/// back) and one budget for every shard's memtables. Without it each column family of each shard
/// gets RocksDB's defaults — its own 32 MiB block cache and up to two 64 MiB memtables — so a pod's
/// memory grows with the partitions it owns. Cheap to clone (handles to the same cache and budget).
#[derive(Clone)]
pub struct StorageMemory {
    block_cache: rocksdb::Cache,
    memtables: rocksdb::WriteBufferManager,
    block_cache_bytes: usize,
    memtable_bytes: usize,
}

impl std::fmt::Debug for StorageMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("StorageMemory")
            .field("block_cache_bytes", &self.block_cache_bytes)
            .field("memtable_bytes", &self.memtable_bytes)
            .finish()
    }
}

impl StorageMemory {
    /// A block cache of `block_cache_bytes` and a memtable budget of `memtable_bytes`: once the
    /// shards' mutable memtables together pass 7/8 of it (or all memtables pass it while the
    /// mutable ones hold half), the shard being written flushes its oldest memtable. A soft
    /// target: writes are not stalled, and memtables being flushed still count.
    pub fn new(block_cache_bytes: usize, memtable_bytes: usize) -> StorageMemory {
        StorageMemory {
            block_cache: rocksdb::Cache::new_lru_cache(block_cache_bytes),
            memtables: rocksdb::WriteBufferManager::new_write_buffer_manager(memtable_bytes, false),
            block_cache_bytes,
            memtable_bytes,
        }
    }

    /// Bytes in the block cache now.
    pub fn block_cache_usage_bytes(&self) -> usize {
        self.block_cache.get_usage()
    }

    /// Bytes of memtables now, all shards together.
    pub fn memtable_usage_bytes(&self) -> usize {
        self.memtables.get_usage()
    }
}
