// Batches of the generated MQAR task (data/mqar.h): the train split is examples
// [0, train_examples) of the stream of seed `data.mqar.seed`, the val split those of `val_seed`,
// generated once in memory. Only answer positions carry labels, so loss and accuracy count recall.
#pragma once

#include "data/batch_source.h"
#include "data/mqar.h"

namespace darkformer {

class MqarSource : public BatchSource {
 public:
  MqarSource(const DataConfig& config, const std::string& split);

  void FillRow(int64_t row, int64_t* inputs, int64_t* labels) const override;
  int64_t vocab_size() const override { return config_.mqar.task.vocab_size; }
  std::string Describe() const override;

 private:
  MqarExamples examples_;
};

}  // namespace darkformer
