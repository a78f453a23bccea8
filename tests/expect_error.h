#pragma once

// EXPECT_ERROR(statement, words): the statement throws te::Error and its message contains
// `words` (the culprit it must name). Plain EXPECT_THROW passes on any message, so a check that
// names the wrong thing, or none, would go unnoticed.

#include <gtest/gtest.h>

#include <string>

#include "te/error.h"

#define EXPECT_ERROR(statement, words)                                                           \
  do {                                                                                           \
    try {                                                                                        \
      statement;                                                                                 \
      ADD_FAILURE() << #statement " did not throw te::Error";                                    \
    } catch (const ::te::Error& te_expect_error_) {                                              \
      const std::string te_expect_msg_ = te_expect_error_.what();                                \
      EXPECT_NE(te_expect_msg_.find(words), std::string::npos)                                   \
          << #statement " threw: " << te_expect_msg_ << "\n  expected it to contain: " << words; \
    }                                                                                            \
  } while (0)
