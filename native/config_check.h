// config_check.h — init()'s agreement on the GRADFLOW_* settings that
// change what ranks send (config_check.cc).
#pragma once

#include <string>

#include "config.h"
#include "mpi_comm.h"

namespace gradflow {

// Collective over `comm`: returns when every rank's protocol-relevant
// settings are equal; else throws GradflowError on every rank with the same
// text naming each setting that differs and the ranks on each side. A rank
// whose values did not parse passes its error as `config_error` (and the
// defaults as `cfg`): every rank then raises at once naming that rank.
void check_config_matches_everywhere(MpiComm& comm, const Config& cfg,
                                     const std::string& config_error);

}  // namespace gradflow
