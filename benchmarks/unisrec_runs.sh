#!/usr/bin/env bash
# The UniSRec runs behind benchmarks/results/unisrec.json, in the order they were run on a 2-core
# CPU (one torch thread each, at most two runs at a time). `python benchmarks/unisrec_report.py` collects them.
#   bash benchmarks/unisrec_runs.sh scratch | scratch-transductive[-wd] | scratch-then-id | then-id-lr | two-stage-seed SEED | pretrain NEG | finetune NEG SETTING | cold-split | cold-sasrec
#                                   | scratch-hist | two-stage-hist SEED | finetune-hist NEG SETTING
#                                   | cold-unisrec | cold-unisrec-scratch | cold-zero-shot | cold-zero-shot-hist | cold-pretrained
#                                   | cold-pretrained-hist trained|all | memory
# The pre-trained model is $PRETRAINED (default $R/pretrained-games):
#   SEQREC_HOME=benchmarks/work seqrec pretrain --config configs/pretrain.toml --out $R/pretrained-games
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
P=benchmarks/work/prepared
R=benchmarks/work/runs
SCI=$P/amazon-scientific-unisrec
CFG=benchmarks/configs/unisrec-amazon-scientific-unisrec.toml
BUDGET=${BUDGET:-3000}  # training seconds per run (fine-tuning, cold split)
PRETRAIN_BUDGET=${PRETRAIN_BUDGET:-1500}
HIST=${HIST:-games-centre-hist}  # the pre-trained model (under $R/xfer) of the *-hist cold runs; other names suffix the runs
SUFFIX=$([ "$HIST" = games-centre-hist ] || echo "-$HIST")${TAG:-}  # TAG: a run again under a new name
case "$1" in
  scratch)  # text only, no pre-training
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --out $R/unisrec-scratch-text ;;
  scratch-transductive)  # text + ID, no pre-training, same budget as the fine-tuning runs
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --set model.item_ids=true \
      --out $R/unisrec-scratch-text-id ;;
  scratch-transductive-wd)  # the same with AdamW, weight decay 0.1 (the text + ID run overfits within a few epochs)
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --set model.item_ids=true \
      --set train.optimizer=\"adamw\" --set train.weight_decay=0.1 --out $R/unisrec-scratch-text-id-wd ;;
  scratch-then-id)  # two stages on the domain's own training events: text only (no refit: its validation-chosen
    # model has seen no validation event), then text + ID from it, every weight trained, refit before the test
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --set train.refit=false \
      --out $R/unisrec-scratch-text-norefit
    .venv/bin/seqrec finetune $SCI --from $R/unisrec-scratch-text-norefit --setting transductive --config $CFG \
      --set model.freeze_encoder=false --set train.progress=false --out $R/unisrec-text-then-id ;;
  then-id-lr)  # the second stage of scratch-then-id again, at a tenth of the learning rate
    .venv/bin/seqrec finetune $SCI --from $R/unisrec-scratch-text-norefit --setting transductive --config $CFG \
      --set model.freeze_encoder=false --set train.lr=0.0001 --set train.progress=false \
      --out $R/unisrec-text-then-id-lr1e-4 ;;
  two-stage-seed)  # both stages of the recipe (second stage at lr 1e-4) with another seed: $2
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --set train.refit=false \
      --set train.seed=$2 --out $R/unisrec-scratch-text-norefit-seed$2
    .venv/bin/seqrec finetune $SCI --from $R/unisrec-scratch-text-norefit-seed$2 --setting transductive \
      --config $CFG --set model.freeze_encoder=false --set train.lr=0.0001 --set train.seed=$2 \
      --set train.progress=false --out $R/unisrec-text-then-id-lr1e-4-seed$2 ;;
  scratch-hist)  # text only from scratch, with the learned history bias (model.history_bias)
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --set model.history_bias=true \
      --out $R/unisrec-scratch-text-hist ;;
  two-stage-hist)  # the two-stage recipe (second stage at lr 1e-4), both stages with the history bias; seed $2
    .venv/bin/seqrec train --dataset $SCI --config $CFG --set train.progress=false --set train.refit=false \
      --set model.history_bias=true --set train.seed=$2 --out $R/unisrec-scratch-text-hist-norefit-seed$2
    .venv/bin/seqrec finetune $SCI --from $R/unisrec-scratch-text-hist-norefit-seed$2 --setting transductive \
      --config $CFG --set model.freeze_encoder=false --set train.lr=0.0001 --set train.seed=$2 \
      --set model.history_bias=true --set train.progress=false --out $R/unisrec-text-then-id-hist-seed$2 ;;
  finetune-hist)  # $2 = in-batch | moco, $3 = inductive | transductive; with the history bias
    .venv/bin/seqrec finetune $SCI --from $R/unisrec-pretrain-$2 --setting "$3" --config $CFG \
      --set train.progress=false --set train.time_budget_s=$BUDGET --set model.history_bias=true \
      --out $R/unisrec-ft-$2-$3-hist ;;
  pretrain)  # $2 = in-batch | moco; never on the Scientific domain or its LC-Rec build
    .venv/bin/seqrec pretrain --datasets $P/yelp-p5,$P/ml-100k --negatives "$2" \
      --set pretrain.threads=1 --set pretrain.progress=false --set pretrain.epochs=30 \
      --set pretrain.batch_size=64 --set pretrain.time_budget_s=$PRETRAIN_BUDGET --set pretrain.queue_size=4096 \
      --set model.d=64 --set model.n_heads=2 --set model.d_ff=256 --set model.dropout=0.5 \
      --set model.attn_dropout=0.5 --out $R/unisrec-pretrain-$2 ;;
  finetune)  # $2 = in-batch | moco, $3 = inductive | transductive
    .venv/bin/seqrec finetune $SCI --from $R/unisrec-pretrain-$2 --setting "$3" --config $CFG \
      --set train.progress=false --set train.time_budget_s=$BUDGET --out $R/unisrec-ft-$2-$3 ;;
  cold-split)  # a split whose test targets never occur before the test (20% of the test-target items)
    (cd benchmarks && ../.venv/bin/python unisrec_report.py --make-cold-split) ;;
  cold-sasrec)
    .venv/bin/seqrec train --dataset $P/amazon-scientific-unisrec-cold20 \
      --config benchmarks/configs/sasrec-amazon-scientific-unisrec.toml --set train.progress=false \
      --set train.time_budget_s=$BUDGET --out $R/sasrec-cold20 ;;
  cold-unisrec-scratch)  # text only, no pre-training: what text alone gives on cold items
    .venv/bin/seqrec train --dataset $P/amazon-scientific-unisrec-cold20 --config $CFG --set train.progress=false \
      --set train.time_budget_s=$BUDGET --out $R/unisrec-cold20-scratch-text ;;
  cold-unisrec)
    .venv/bin/seqrec finetune $P/amazon-scientific-unisrec-cold20 --from $R/unisrec-pretrain-in-batch \
      --setting inductive --config $CFG --set train.progress=false --set train.time_budget_s=$BUDGET \
      --out $R/unisrec-cold20-ft-in-batch-inductive ;;
  cold-zero-shot)  # the universal pre-trained model (configs/pretrain.toml, no Scientific) with no training
    .venv/bin/seqrec finetune $P/amazon-scientific-unisrec-cold20 --from ${PRETRAINED:-$R/pretrained-games} --setting zero-shot \
      --out $R/unisrec-cold20-pretrained-zero-shot ;;
  cold-zero-shot-hist)  # Games pre-trained with the history bias learnt (data_efficiency's games-centre-hist), no training
    .venv/bin/seqrec text encode $P/amazon-scientific-unisrec-cold20 --missing id --no-progress
    .venv/bin/seqrec finetune $P/amazon-scientific-unisrec-cold20 --from $R/xfer/$HIST --setting zero-shot \
      --out $R/unisrec-cold20-pretrained-hist-zero-shot$SUFFIX ;;
  cold-pretrained)  # the same fine-tuned text only, every weight trained (the data-efficiency recipe)
    .venv/bin/seqrec finetune $P/amazon-scientific-unisrec-cold20 --from ${PRETRAINED:-$R/pretrained-games} --setting inductive \
      --config $CFG --set model.freeze_encoder=false --set train.progress=false --set train.refit=false \
      --set train.time_budget_s=$BUDGET --out $R/unisrec-cold20-pretrained-inductive ;;
  cold-pretrained-hist)  # Games pre-trained (history bias learnt), fine-tuned inductive, every weight trained,
    # with the training softmax over the items that have training events (trained) or over every item (all)
    .venv/bin/seqrec text encode $P/amazon-scientific-unisrec-cold20 --missing id --no-progress
    .venv/bin/seqrec finetune $P/amazon-scientific-unisrec-cold20 --from $R/xfer/$HIST --setting inductive \
      --config $CFG --set model.freeze_encoder=false --set "model.softmax_items=\"$2\"" --set train.progress=false \
      --set train.refit=false --set train.time_budget_s=${BUDGET_COLD:-900} \
      --out $R/unisrec-cold20-pretrained-hist-inductive-softmax-$2$SUFFIX ;;
  memory)  # peak memory of a few pre-training steps: MoCo (batch 256, 8192 queued) vs in-batch (batch 8192)
    for spec in "moco 256 8192" "in-batch 256 8192" "in-batch 8192 8192"; do
      set -- $spec
      .venv/bin/seqrec pretrain --datasets $P/yelp-p5,$P/ml-100k --negatives $1 \
        --set pretrain.threads=1 --set pretrain.progress=false --set pretrain.max_steps=3 \
        --set pretrain.positions=\"last\" --set pretrain.batch_size=$2 --set pretrain.queue_size=$3 \
        --out $R/unisrec-memory-$1-b$2
    done ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
