"""Column names of every batch and episode field, in one place (RLlib's names and values)."""


class Columns:
    """Names of the columns that connectors, modules and learners read and write."""

    # What the env returns from reset() / step().
    OBS = "obs"
    INFOS = "infos"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    # Observation after the action: only algorithms that learn from TD tuples use it.
    NEXT_OBS = "new_obs"

    # The action the module chose, and the same action made fit for env.step() (unsquashed, clipped).
    ACTIONS = "actions"
    ACTIONS_FOR_ENV = "actions_for_env"

    # Identity of a row.
    EPS_ID = "eps_id"
    AGENT_ID = "agent_id"
    MODULE_ID = "module_id"
    # Episode time step of a row.
    T = "t"
    # Length of each sequence in a zero-padded (B, T, ...) batch.
    SEQ_LENS = "seq_lens"

    # Module inputs and outputs.
    STATE_IN = "state_in"
    STATE_OUT = "state_out"
    FEATURES = "features"
    EMBEDDINGS = "embeddings"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    ACTION_PROB = "action_prob"
    ACTION_LOGP = "action_logp"

    # Value predictions, and the value one step past the last step (for bootstrapping).
    VF_PREDS = "vf_preds"
    VALUES_BOOTSTRAPPED = "values_bootstrapped"

    # Written by the learner pipeline.
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    INTRINSIC_REWARDS = "intrinsic_rewards"
    # False where a row is padding and must not count in the loss.
    LOSS_MASK = "loss_mask"

    # rlgate's own: the model version that chose the action of each step (an extra model output).
    MODEL_VERSION = "model_version"
    # rlgate's own: log pi(a|s) of the module as it was when the update began (PPO's proximal policy).
    PROXIMAL_ACTION_LOGP = "proximal_action_logp"


# The outputs of the module-to-env pipeline that servers record in episodes as extra model outputs (when made),
# and the only ones a learner takes from their chunks.
RECORDED_OUTPUTS = (
    Columns.ACTION_LOGP,
    Columns.ACTION_DIST_INPUTS,
    Columns.VF_PREDS,
    Columns.STATE_OUT,
    Columns.MODEL_VERSION,
)
