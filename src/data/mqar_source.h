// Batches of the generated MQAR task (data/mqar.h): the train split is examples
// [0, train_examples) of the stream of seed `data.mqar.seed`, the val split those of `val_seed`,
// each made when a batch asks for its row (example i is a function of (seed, i)), so memory does not
// grow with train_examples. Only answer positions carry labels, so loss and accuracy count recall.
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
  bool PacksDocuments() const override { return false; }  // one example per row, no EOS

 private:
  MqarOptions task_;            // with this split's seed and the run's seq_len
  std::vector<double> gap_p_;   // the query-gap law, computed once
};

}  // namespace darkformer
