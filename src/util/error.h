// Errors that name their culprit: a config key path, a file and line, a tensor name.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace darkformer {

// The one exception type the application throws for bad input or a failed invariant.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void Fail(const std::string& message) { throw Error(message); }

}  // namespace darkformer

// DF_CHECK(cond, "what" << culprit): throws darkformer::Error with the streamed message.
#define DF_CHECK(cond, message)                                       \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::ostringstream df_check_stream_;                            \
      df_check_stream_ << message;                                    \
      throw ::darkformer::Error(df_check_stream_.str());              \
    }                                                                 \
  } while (0)
