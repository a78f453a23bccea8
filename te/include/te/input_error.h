#pragma once

// The error of bad input a program reports: a command line's values, a data file, a checkpoint
// that does not fit. Not a te::Error (the library's misuse, tagged with its source line): its
// message is one line for a user, and the programs exit with status 2 on it.

#include <stdexcept>

namespace te {

/// Bad input a program reports in one line, with no source tag (exit status 2). Thrown by the
/// programs' libraries (te::encoder's CoLA reader, te::program's options) and the programs.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace te
