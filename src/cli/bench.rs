//! `sluice bench …`: the benchmark's parts that need the library (driven by `scripts/bench`;
//! each prints one JSON object).
//!
//! Owns: those subcommands' arguments. Must not: be used by `agent` or `persist`.

use std::path::PathBuf;

use clap::Subcommand;
use sluice::config::Config;

/// What `sluice bench` runs.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Write records to a socket, one blocking write per record, timing every write call.
    Load {
        /// The socket.
        #[arg(long)]
        socket: PathBuf,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The ingest ceiling: the same writers into a reader that discards.
    SocketCeiling {
        /// Directory for the socket.
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The shipping ceiling: a raw librdkafka producer with the agent's settings.
    ProducerCeiling {
        /// Agent config whose [kafka] and [ship] settings the producer uses.
        #[arg(short, long)]
        config: PathBuf,
        /// Topic to send to.
        #[arg(long)]
        topic: String,
        /// Records in total.
        #[arg(long)]
        records: u64,
        /// Record size in bytes (the envelope around it is the agent's).
        #[arg(long, default_value_t = 256, conflicts_with = "sample")]
        size: usize,
        /// Draw records from this JSON-lines sample instead.
        #[arg(long)]
        sample: Option<PathBuf>,
    },
    /// Creates a topic (by a metadata request, as auto-creation does) and waits for its leaders.
    EnsureTopic {
        /// Bootstrap servers.
        #[arg(long)]
        brokers: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
    /// Reads a topic to its end: messages and distinct record ids.
    TopicRecords {
        /// Bootstrap servers.
        #[arg(long)]
        brokers: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
    /// Messages in a topic (sum of high minus low watermarks).
    TopicCount {
        /// Bootstrap servers.
        #[arg(long)]
        brokers: String,
        /// The topic.
        #[arg(long)]
        topic: String,
    },
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// Records in total.
    #[arg(long)]
    records: u64,
    /// Concurrent connections (one thread each).
    #[arg(long, default_value_t = 1)]
    connections: u32,
    /// Records per second over all connections; 0: as fast as possible.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Record size in bytes, newline included.
    #[arg(long, default_value_t = 256, conflicts_with = "sample")]
    size: usize,
    /// Draw records from this JSON-lines sample instead (e.g. bench/sample.jsonl).
    #[arg(long)]
    sample: Option<PathBuf>,
}

impl LoadArgs {
    fn options(&self) -> Result<sluice::bench::LoadOptions, sluice::bench::BenchError> {
        Ok(sluice::bench::LoadOptions {
            records: self.records,
            connections: self.connections,
            rate: self.rate,
            shape: shape(self.size, self.sample.as_deref())?,
        })
    }
}

/// Padded records of `size` bytes, or the lines of `sample`.
fn shape(size: usize, sample: Option<&std::path::Path>) -> Result<sluice::bench::Shape, sluice::bench::BenchError> {
    match sample {
        Some(path) => sluice::bench::Shape::sample(path),
        None => Ok(sluice::bench::Shape::Padded(size)),
    }
}

/// Runs one benchmark part and prints its JSON.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    use sluice::bench;
    let json = match command {
        BenchCommand::Load { socket, load } => serde_json::to_string(&bench::load(&socket, &load.options()?)?)?,
        BenchCommand::SocketCeiling { dir, load } => {
            serde_json::to_string(&bench::socket_ceiling(&dir, &load.options()?)?)?
        }
        BenchCommand::ProducerCeiling { config, topic, records, size, sample } => {
            let config = Config::load(&config)?;
            serde_json::to_string(&bench::producer_ceiling(
                &config,
                &topic,
                records,
                &shape(size, sample.as_deref())?,
            )?)?
        }
        BenchCommand::EnsureTopic { brokers, topic } => {
            bench::ensure_topic(&brokers, &topic)?;
            serde_json::json!({ "topic": topic }).to_string()
        }
        BenchCommand::TopicRecords { brokers, topic } => {
            serde_json::to_string(&bench::topic_records(&brokers, &topic)?)?
        }
        BenchCommand::TopicCount { brokers, topic } => {
            serde_json::json!({ "messages": bench::topic_count(&brokers, &topic)? }).to_string()
        }
    };
    println!("{json}");
    Ok(())
}
