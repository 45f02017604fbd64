/**
 * A work queue in TypeScript: a pool of workers takes jobs from a topic under leases.
 *
 * The SDK's consumer renews each lease while its job runs longer than the topic's
 * visibility timeout, acks a job when the handler resolves, hands it back when it
 * throws, and drains on stop(): running jobs finish and are acked, jobs fetched but
 * never started go back to the queue. SIGINT or SIGTERM stops it, so a deploy loses
 * nothing.
 *
 *   node dist/worker.js --jobs 20                    # enqueue 20 jobs, work until Ctrl-C
 *   node dist/worker.js --jobs 20 --exit-when-empty
 */
import { parseArgs } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, type Message } from "@narad/client";

interface Job {
  id: number;
  task: string;
  workMs: number;
}

const { values: args } = parseArgs({
  options: {
    topic: { type: "string", default: "jobs" },
    jobs: { type: "string", default: "0" },
    workers: { type: "string", default: "4" },
    "work-ms": { type: "string", default: "4000" },
    "lease-ms": { type: "string", default: "3000" },
    "exit-when-empty": { type: "boolean", default: false },
    help: { type: "boolean", default: false },
  },
});
if (args.help) {
  console.log(`usage: node dist/worker.js [options]
  --topic NAME          the queue's topic, created when missing (jobs)
  --jobs N              jobs to enqueue before working (0: only work)
  --workers N           jobs handled at once (4)
  --work-ms MS          how long each enqueued job takes (4000)
  --lease-ms MS         visibility timeout of the topic when this creates it (3000);
                        shorter than --work-ms, so leases must be renewed
  --exit-when-empty     stop (draining) once the queue has no unsettled job left`);
  process.exit(0);
}
const topic = args.topic;
const jobs = Number(args.jobs);
const workers = Number(args.workers);
const workMs = Number(args["work-ms"]);
const leaseMs = Number(args["lease-ms"]);

const url = process.env.NARAD_URL ?? "http://127.0.0.1:7942";
const client = new Client({
  endpoints: url.split(","),
  ...(process.env.NARAD_USER ? { auth: { username: process.env.NARAD_USER, password: process.env.NARAD_PASSWORD ?? "" } } : {}),
});

/** backlog counts the topic's unsettled messages: waiting, leased or handed back. */
async function backlog(): Promise<number> {
  const t = await client.getTopic(topic);
  return t.partitionStats.reduce((n, p) => n + p.backlog, 0);
}

async function main(): Promise<number> {
  const info = await client.ensureTopic({ name: topic, visibilityTimeoutMs: leaseMs });
  console.log(`queue ${topic}: ${info.partitions} partitions, lease ${info.visibilityTimeoutMs / 1000}s, ${workers} workers`);

  if (jobs > 0) {
    const batch = Array.from({ length: jobs }, (_, i) => ({
      body: { id: i + 1, task: `resize image ${i + 1}`, workMs } satisfies Job,
    }));
    await client.produceBatch(topic, batch);
    console.log(`enqueued ${jobs} jobs`);
  }

  let handled = 0;
  const handler = async (msg: Message, { signal }: { signal: AbortSignal }): Promise<void> => {
    const job = msg.json<Job>();
    // `signal` aborts when the lease is lost (another worker may take the job) or the
    // shutdown grace ran out; the rejection hands the job back, and the consumer never
    // acks a job whose lease is lost.
    await sleep(job.workMs, undefined, { signal });
    handled++;
    console.log(`job ${job.id} done (partition ${msg.partition} offset ${msg.offset}, delivery ${msg.deliveryAttempt}) [${handled} handled]`);
    // Resolving acks the job (the consumer confirms the ack).
  };

  const consumer = client.consume(topic, handler, { concurrency: workers, shutdownGraceMs: 30_000 });

  let signalled = false;
  const onSignal = (): void => {
    signalled = true;
    void consumer.stop(); // drain: stop polling, finish running jobs, hand back the rest
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);

  if (args["exit-when-empty"]) {
    void (async () => {
      while (!signalled) {
        await sleep(500);
        if ((await backlog().catch(() => -1)) === 0) {
          console.log("queue empty: stopping");
          await consumer.stop();
          return;
        }
      }
    })();
  }

  let failed = false;
  try {
    await consumer.done; // resolves after stop(), rejects on a terminal error
  } catch (err) {
    console.error("error:", err);
    failed = true;
  }
  if (signalled) console.log("signal received: drained");
  const st = consumer.stats;
  console.log(`handled ${handled} jobs (lease renewals ${st.renewed}, leases lost ${st.leaseLost}, handed back ${st.nacked})`);
  return failed ? 1 : 0;
}

let code = 1;
try {
  code = await main();
} catch (err) {
  console.error("error:", err);
} finally {
  await client.close();
}
process.exit(code);
