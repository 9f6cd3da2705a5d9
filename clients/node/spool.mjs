// The batches a local-inference client sent and the server has not acknowledged yet, by their seq (client.mjs,
// --mode local): in memory, or with a directory on disk too, as the Python client's spool keeps them
// (delivery/spool.py), so that a restart of the process loses none of them. Each batch is written before it is
// sent (to a temporary file, renamed into place: a kill leaves a whole file or none), deleted after its ack, and a
// new process with the same directory sends every one it finds first, numbering its own batches after them.
//
//   const spool = new Spool(directory, codec);   // codec: {encode(batch) -> bytes, decode(bytes) -> batch}
//   for (const [seq, { batch, steps }] of spool) ...;  spool.set(seq, { batch, steps });  spool.delete(seq);
//
// One process per directory: a second one with the same directory fails while the first (its pid and start time
// in `.lock`) lives. `bytes` counts what it holds (each batch as it is sent), for the client's --max-spool-bytes.

import fs from "node:fs";
import path from "node:path";

const SUFFIX = ".batch";

// Env steps in a batch: every chunk of its EpisodeChunks tables (int64 counts arrive as strings).
export function batchSteps(batch) {
  return batch.chunks.reduce((n, table) => n + table.steps.reduce((m, steps) => m + Number(steps), 0), 0);
}

export class Spool {
  constructor(directory, codec) {
    this.directory = directory ?? null;
    this.codec = codec;
    this.entries = new Map(); // seq (a string) -> {batch, steps, bytes}, in seq order
    this.bytes = 0; // the batches' serialised bytes, all together
    this.lastSeq = 0; // the largest seq held at the start (a new batch takes the next)
    this.loaded = 0; // batches found on disk at the start
    if (this.directory !== null) this.open();
  }

  open() {
    fs.mkdirSync(this.directory, { recursive: true });
    this.lock();
    const names = fs.readdirSync(this.directory);
    for (const name of names.filter((n) => n.endsWith(".tmp"))) fs.rmSync(path.join(this.directory, name));
    const seqs = names.filter((n) => n.endsWith(SUFFIX)).map((n) => Number(n.slice(0, -SUFFIX.length)));
    for (const seq of seqs.sort((a, b) => a - b)) {
      const data = fs.readFileSync(this.file(seq));
      const batch = this.codec.decode(data);
      this.entries.set(String(seq), { batch, steps: batchSteps(batch), bytes: data.length });
      this.bytes += data.length;
      this.lastSeq = seq;
    }
    this.loaded = seqs.length;
  }

  // `.lock` names this process (`identity`) and is made only where there is none; one whose process is gone (a
  // kill) is taken over, as is one whose pid now belongs to another process (its start time differs).
  lock() {
    const lockFile = path.join(this.directory, ".lock");
    const mine = identity(process.pid);
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        fs.writeFileSync(lockFile, mine, { flag: "wx" });
        return;
      } catch (error) {
        if (error.code !== "EEXIST") throw error;
      }
      let held = null;
      try {
        held = fs.readFileSync(lockFile, "utf8").trim();
      } catch (error) {
        if (error.code !== "ENOENT") throw error; // its holder ended meanwhile: take it
      }
      if (held !== null) {
        const holder = Number(held.split(" ")[0]);
        if (holder !== process.pid && identity(holder) === held) {
          throw new Error(`--spool-dir ${this.directory} is in use by process ${holder}`);
        }
        fs.rmSync(lockFile, { force: true });
      }
    }
    throw new Error(`--spool-dir ${this.directory}: another process takes its .lock at the same time`);
  }

  file(seq) {
    return path.join(this.directory, `${String(seq).padStart(12, "0")}${SUFFIX}`);
  }

  get size() {
    return this.entries.size;
  }

  [Symbol.iterator]() {
    return this.entries[Symbol.iterator]();
  }

  values() {
    return this.entries.values();
  }

  get(seq) {
    return this.entries.get(seq);
  }

  // Kept (on disk first, with a directory) before the batch is sent.
  set(seq, entry) {
    const data = this.codec.encode({ ...entry.batch, seq });
    if (this.directory !== null) {
      const [file, temporary] = [this.file(seq), path.join(this.directory, `.${seq}.tmp`)];
      const fd = fs.openSync(temporary, "w");
      try {
        fs.writeSync(fd, data);
        fs.fsyncSync(fd);
      } finally {
        fs.closeSync(fd);
      }
      fs.renameSync(temporary, file);
    }
    this.entries.set(seq, { ...entry, bytes: data.length });
    this.bytes += data.length;
  }

  // Acknowledged: gone.
  delete(seq) {
    if (this.directory !== null) fs.rmSync(this.file(seq), { force: true });
    this.bytes -= this.entries.get(seq)?.bytes ?? 0;
    this.entries.delete(seq);
  }

  close() {
    if (this.directory !== null) fs.rmSync(path.join(this.directory, ".lock"), { force: true });
  }
}

// "PID START" for a running process (START: its start time, /proc/PID/stat's 22nd field, on Linux; a pid that is
// reused after its process ended gets another), "PID" where there is no /proc; null when no such process runs.
function identity(pid) {
  try {
    process.kill(pid, 0);
  } catch (error) {
    if (error.code !== "EPERM") return null;
  }
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return `${pid} ${stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]}`;
  } catch {
    return String(pid);
  }
}
