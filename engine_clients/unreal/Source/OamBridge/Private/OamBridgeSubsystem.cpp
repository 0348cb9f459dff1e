// OamBridgeSubsystem.cpp - the Unreal layer over the engine-agnostic core (Core/oam_client.h).
#include "OamBridgeSubsystem.h"

#include "Async/Async.h"
#include "HAL/PlatformMisc.h"
#include "Misc/Paths.h"

#include <chrono>
#include <exception>
#include <string>

#include "oam_client.h"
#include "oam_process.h"

namespace
{
FString ToFString(const std::string& S)
{
	return FString(UTF8_TO_TCHAR(S.c_str()));
}

std::string ToStd(const FString& S)
{
	return std::string(TCHAR_TO_UTF8(*S));
}

// "" -> fallback; invalid JSON -> discarded (is_discarded()).
oam::json ParseJson(const FString& Text, oam::json Fallback)
{
	if (Text.TrimStartAndEnd().IsEmpty())
	{
		return Fallback;
	}
	return oam::json::parse(ToStd(Text), nullptr, false);
}

FString Dump(const oam::json& J)
{
	return ToFString(J.dump(-1, ' ', false, oam::json::error_handler_t::replace));
}

std::string Str(const oam::json& Params, const char* Key)
{
	return oam::stringField(Params, Key);
}
}  // namespace

UOamBridgeSubsystem::UOamBridgeSubsystem() = default;
UOamBridgeSubsystem::~UOamBridgeSubsystem() = default;

void UOamBridgeSubsystem::Initialize(FSubsystemCollectionBase& Collection)
{
	Super::Initialize(Collection);
	bClosing = false;

	FString Command = FPlatformMisc::GetEnvironmentVariable(TEXT("OAM_BRIDGE_CMD"));
	if (Command.IsEmpty())
	{
		Command = BridgeCommand;
	}
	const FString Dir = FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), BridgeWorkingDirectory));

	oam::ClientOptions Options;
	Options.command = oam::splitCommandLine(ToStd(Command));
	Options.workingDirectory = ToStd(Dir);
	Options.onLog = [](const std::string& Line)  // any thread; UE_LOG is thread-safe
	{ UE_LOG(LogOamBridge, Log, TEXT("%s"), UTF8_TO_TCHAR(Line.c_str())); };
	// Every core callback (events, tool handlers, request callbacks) runs on the game thread,
	// and not at all once this subsystem is gone or closing: the handlers below capture `this`
	// safely because they only ever run inside this check.
	TWeakObjectPtr<UOamBridgeSubsystem> WeakThis(this);
	Options.dispatcher = [WeakThis](std::function<void()> Fn)
	{
		AsyncTask(ENamedThreads::GameThread, [WeakThis, Fn = MoveTemp(Fn)]()
			{
				const UOamBridgeSubsystem* Self = WeakThis.Get();
				if (Self && !Self->bClosing)
				{
					Fn();
				}
			});
	};

	try
	{
		Client = MakeUnique<oam::Client>(std::move(Options));
	}
	catch (const std::exception& E)
	{
		UE_LOG(LogOamBridge, Error, TEXT("could not start the bridge (%s): %s"), *Command, UTF8_TO_TCHAR(E.what()));
		return;
	}
	UE_LOG(LogOamBridge, Log, TEXT("started the bridge: %s (pid %ld) in %s"), *Command, Client->pid(), *Dir);

	Client->on("turn/textDelta", [this](const oam::Event& E)
		{
			OnTextDelta.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()), ToFString(Str(E.params, "delta")),
				oam::boolField(E.params, "isReset"));
		});
	Client->on("turn/toolCallRequested", [this](const oam::Event& E)
		{
			OnToolCallRequested.Broadcast(ToFString(E.npcId()), ToFString(E.turnId()), ToFString(Str(E.params, "callId")),
				ToFString(Str(E.params, "name")), Dump(E.params.contains("arguments") ? E.params["arguments"] : oam::json::object()));
		});
	// Requests are pipelined: npc/create and the rest may be sent before this answers.
	Client->request("initialize",
		{{"protocolVersion", 1}, {"clientInfo", {{"name", "oam-unreal"}, {"version", "0.1.0"}}}},
		[](const oam::Response& R)
		{
			if (!R.ok())
			{
				UE_LOG(LogOamBridge, Error, TEXT("initialize failed: %s"), UTF8_TO_TCHAR(R.error->what()));
			}
		});
}

void UOamBridgeSubsystem::Deinitialize()
{
	bClosing = true;
	if (Client)
	{
		// stdin EOF: the bridge cancels its turns and exits 0; close() waits, joins its threads.
		const int Code = Client->close();
		UE_LOG(LogOamBridge, Log, TEXT("the bridge exited with status %d"), Code);
		Client.Reset();
	}
	Super::Deinitialize();
}

static void LogIfFailed(const char* What, const oam::Response& R)
{
	if (!R.ok())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("%s failed: %s (%s)"), UTF8_TO_TCHAR(What), UTF8_TO_TCHAR(R.error->what()),
			UTF8_TO_TCHAR(R.error->code.c_str()));
	}
}

bool UOamBridgeSubsystem::CreateNpc(const FString& NpcId, const FString& Instructions, const FString& ExtraParamsJson)
{
	oam::json Params = ParseJson(ExtraParamsJson, oam::json::object());
	if (!Client || !Params.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("CreateNpc(%s): no bridge, or ExtraParamsJson is not a JSON object"), *NpcId);
		return false;
	}
	Params["npcId"] = ToStd(NpcId);
	if (!Instructions.IsEmpty())
	{
		Params["instructions"] = ToStd(Instructions);
	}
	Client->request("npc/create", std::move(Params), [](const oam::Response& R) { LogIfFailed("npc/create", R); });
	return true;
}

bool UOamBridgeSubsystem::Respond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson)
{
	oam::json Options = ParseJson(OptionsJson, oam::json::object());
	if (!Client || !Options.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("Respond(%s): no bridge, or OptionsJson is not a JSON object"), *NpcId);
		return false;
	}
	oam::Turn::Callbacks Callbacks;
	Callbacks.onFinished = [this](const oam::Turn& Turn)
	{
		const FString Npc = ToFString(Turn.npcId());
		const FString TurnId = ToFString(Turn.turnId());
		try
		{
			const oam::json Completed = Turn.completion().get();
			OnTurnCompleted.Broadcast(Npc, TurnId, ToFString(Str(Completed, "text")), Dump(Completed));
		}
		catch (const oam::BridgeError& E)
		{
			OnTurnFailed.Broadcast(Npc, TurnId, ToFString(E.code), UTF8_TO_TCHAR(E.what()));
		}
	};
	Client->respond(ToStd(NpcId), ToStd(Prompt), std::move(Options), std::move(Callbacks));
	return true;
}

bool UOamBridgeSubsystem::SubmitToolOutput(const FString& NpcId, const FString& CallId, const FString& OutputJson)
{
	oam::json Output = ParseJson(OutputJson, nullptr);
	if (!Client || Output.is_discarded())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SubmitToolOutput(%s): no bridge, or OutputJson is not JSON"), *CallId);
		return false;
	}
	Client->request("npc/submit", {{"npcId", ToStd(NpcId)}, {"callId", ToStd(CallId)}, {"output", std::move(Output)}},
		[](const oam::Response& R) { LogIfFailed("npc/submit", R); });
	return true;
}

bool UOamBridgeSubsystem::SubmitToolError(const FString& NpcId, const FString& CallId, const FString& Error)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/submit", {{"npcId", ToStd(NpcId)}, {"callId", ToStd(CallId)}, {"error", ToStd(Error)}},
		[](const oam::Response& R) { LogIfFailed("npc/submit", R); });
	return true;
}

bool UOamBridgeSubsystem::Cancel(const FString& NpcId)
{
	if (!Client)
	{
		return false;
	}
	Client->request("npc/cancel", {{"npcId", ToStd(NpcId)}}, [](const oam::Response& R) { LogIfFailed("npc/cancel", R); });
	return true;
}

FString UOamBridgeSubsystem::SaveTranscript(const FString& NpcId)
{
	if (!Client)
	{
		return FString();
	}
	// The future is settled on the reader thread, never the game thread, so waiting here is safe.
	std::future<oam::json> F = Client->transcript(ToStd(NpcId));
	const auto Timeout = std::chrono::milliseconds(static_cast<long long>(RequestTimeoutSeconds * 1000.f));
	if (F.wait_for(Timeout) != std::future_status::ready)
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SaveTranscript(%s): timed out"), *NpcId);
		return FString();
	}
	try
	{
		return Dump(F.get());
	}
	catch (const oam::BridgeError& E)
	{
		UE_LOG(LogOamBridge, Warning, TEXT("SaveTranscript(%s): %s"), *NpcId, UTF8_TO_TCHAR(E.what()));
		return FString();
	}
}

bool UOamBridgeSubsystem::RestoreTranscript(const FString& SaveJson, const FString& NpcId)
{
	oam::json Save = ParseJson(SaveJson, nullptr);
	if (!Client || !Save.is_object())
	{
		UE_LOG(LogOamBridge, Warning, TEXT("RestoreTranscript: no bridge, or SaveJson is not a JSON object"));
		return false;
	}
	std::future<oam::json> F = Client->restore(std::move(Save), ToStd(NpcId));
	const auto Timeout = std::chrono::milliseconds(static_cast<long long>(RequestTimeoutSeconds * 1000.f));
	if (F.wait_for(Timeout) != std::future_status::ready)
	{
		UE_LOG(LogOamBridge, Warning, TEXT("RestoreTranscript: timed out"));
		return false;
	}
	try
	{
		const oam::json R = F.get();
		UE_LOG(LogOamBridge, Log, TEXT("restored %s with %d turns"), *ToFString(Str(R, "npcId")), static_cast<int>(oam::intField(R, "turns")));
		return true;
	}
	catch (const oam::BridgeError& E)
	{
		UE_LOG(LogOamBridge, Warning, TEXT("RestoreTranscript: %s"), UTF8_TO_TCHAR(E.what()));
		return false;
	}
}

bool UOamBridgeSubsystem::IsBridgeRunning() const
{
	return Client && Client->running();
}
