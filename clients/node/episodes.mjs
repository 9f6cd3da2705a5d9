// Episodes recorded as an rlgate server records a session's (proto/README.md, "Local inference"), for a client that
// acts itself and ships them with PolicyService/SubmitEpisodes: one sub-env's episodes, cut into chunks every
// `rollout_fragment_length` steps (the run spec's sampling, batch_mode "truncate_episodes"; whole episodes
// otherwise), each chunk after the first starting with up to `episode_lookback_horizon` steps of the one before as
// its lookback; and those chunks as one EpisodeChunks table (episode.proto), the columns the learner checks: the
// observations (lookback + steps + 1 rows), the actions as the module chose them (a Box's before they were unsquashed
// or clipped for the env: policy.mjs's `moduleAction`), the rewards, the action_logp and action_dist_inputs the
// action was sampled with, and the model version that chose each step (lookback + steps rows).
//
//   const recorder = new EpisodeRecorder(sessionId, spec.sampling, policy.recordedDtype);
//   recorder.begin(resetObs);
//   const due = recorder.step({ action: moduleAction, logp, distInputs, version }, reward, nextObs, terminated,
//     truncated);
//   recorder.flush(); recorder.close();    // cut the running episode now; end it (truncated, session_closed)

// Little-endian tensors (proto/README.md, "Tensors").
function tensor(dtype, size, write, values, shape) {
  const view = new DataView(new ArrayBuffer(values.length * size));
  values.forEach((v, i) => write(view, i * size, v));
  return { dtype, shape, data: Buffer.from(view.buffer) };
}
const float32 = (values, shape) => tensor("DTYPE_FLOAT32", 4, (d, at, v) => d.setFloat32(at, v, true), values, shape);
const int64 = (values, shape) =>
  tensor("DTYPE_INT64", 8, (d, at, v) => d.setBigInt64(at, BigInt(v), true), values, shape);

// The actions' tensors by dtype: Discrete and MultiDiscrete ones int64, a Box's float32 (the module's samples).
const ACTION_TENSORS = { int64, float32 };

export class EpisodeRecorder {
  constructor(sessionId, sampling, actionDtype = "int64") {
    if (!(actionDtype in ACTION_TENSORS)) throw new Error(`actions of dtype ${actionDtype} are not recorded here`);
    this.sessionId = sessionId;
    this.actionDtype = actionDtype;
    this.fragment = sampling.batch_mode === "truncate_episodes" ? sampling.rollout_fragment_length : Infinity;
    this.lookback = sampling.episode_lookback_horizon;
    this.episodes = 0;
    this.episode = null;
  }

  // A new episode from its reset observation.
  begin(obs) {
    // Rows: observations[i] is the episode's observation i (from `first` on), steps[i] the action taken on it
    // and what followed (reward); `start` is where the chunk being recorded begins, `first` its lookback.
    this.episode = {
      id: `${this.sessionId}-${this.episodes++}`,
      chunkIndex: 0,
      first: 0,
      start: 0,
      observations: [obs],
      steps: [],
    };
  }

  // One env step of the running episode: the action chosen on its newest observation (with the outputs it was
  // sampled with) and what the env returned. The chunks now due: the episode's last when it ended, else the running
  // one cut once it holds rollout_fragment_length steps.
  step(acted, reward, obs, terminated, truncated) {
    const episode = this.episode;
    episode.steps.push({ ...acted, reward });
    episode.observations.push(obs);
    if (terminated || truncated) {
      this.episode = null;
      return [this.chunk(episode, { terminated, truncated })];
    }
    return this.unshipped() >= this.fragment ? this.flush() : [];
  }

  // Steps recorded in the running episode and not shipped yet.
  unshipped() {
    const episode = this.episode;
    return episode === null ? 0 : episode.first + episode.steps.length - episode.start;
  }

  // The running episode's steps so far as a chunk (none without a step); it goes on as the next chunk.
  flush() {
    const episode = this.episode;
    if (this.unshipped() === 0) return [];
    const due = this.chunk(episode, { terminated: false, truncated: false });
    const end = episode.first + episode.steps.length; // the newest observation's index: the next chunk's start
    const first = Math.max(end - this.lookback, episode.first); // the next chunk's lookback
    episode.observations = episode.observations.slice(first - episode.first);
    episode.steps = episode.steps.slice(first - episode.first);
    Object.assign(episode, { first, start: end, chunkIndex: episode.chunkIndex + 1 });
    return [due];
  }

  // The running episode cut off: the client stops (shipped as truncated, and session_closed: its env did not end it).
  close() {
    const episode = this.episode;
    this.episode = null;
    if (episode === null || episode.first + episode.steps.length === episode.start) return [];
    return [this.chunk(episode, { terminated: false, truncated: true, sessionClosed: true })];
  }

  // A chunk of the episode: every row it holds, lookback first.
  chunk(episode, { terminated, truncated, sessionClosed = false }) {
    return {
      actionDtype: this.actionDtype,
      id: episode.id,
      chunkIndex: episode.chunkIndex,
      lookback: episode.start - episode.first,
      steps: episode.first + episode.steps.length - episode.start,
      tStarted: episode.start,
      terminated,
      truncated,
      sessionClosed,
      observations: episode.observations.slice(),
      rows: episode.steps.slice(),
    };
  }
}

// Chunks as one EpisodeChunks table: each column holds every chunk's rows, one chunk after the other.
export function chunkTable(chunks) {
  const observations = chunks.flatMap((c) => c.observations);
  const rows = chunks.flatMap((c) => c.rows);
  const obsWidth = observations[0].length;
  const action = rows[0].action;
  const shape = Array.isArray(action) ? [action.length] : [];
  const actionTensor = ACTION_TENSORS[chunks[0].actionDtype];
  const distWidth = rows[0].distInputs.length;
  return {
    ids: chunks.map((c) => c.id),
    chunk_indices: chunks.map((c) => c.chunkIndex),
    len_lookback_buffers: chunks.map((c) => c.lookback),
    steps: chunks.map((c) => c.steps),
    terminated: chunks.map((c) => c.terminated),
    truncated: chunks.map((c) => c.truncated),
    t_started: chunks.map((c) => c.tStarted),
    observations: { tensor: float32(observations.flat(), [observations.length, obsWidth]) },
    actions: { tensor: actionTensor(rows.flatMap((r) => r.action), [rows.length, ...shape]) },
    rewards: float32(rows.map((r) => r.reward), [rows.length]),
    extra_model_outputs: {
      action_logp: { tensor: float32(rows.map((r) => r.logp), [rows.length]) },
      action_dist_inputs: { tensor: float32(rows.flatMap((r) => r.distInputs), [rows.length, distWidth]) },
    },
    model_versions: int64(rows.map((r) => r.version), [rows.length]),
    session_closed: chunks.some((c) => c.sessionClosed) ? chunks.map((c) => c.sessionClosed) : [],
  };
}
